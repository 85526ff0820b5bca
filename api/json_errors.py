"""Every answer under the API's prefix is JSON, errors included, wherever a project mounts it.

django-ninja answers the errors of its own endpoints in JSON. What happens
around them does not pass through it: a path no endpoint serves, a method an
endpoint does not take, a body over Django's upload limit. Those used to be
turned into JSON by a middleware, which a project had to add and which knew
the API only by a fixed prefix. Instead, the API's own URL patterns carry the
guard (``ChasquiAPI`` wraps each view with ``json_errors`` and ends its
patterns with ``not_found``), so the API answers ``{"detail": "..."}`` under
whatever prefix it is included at, with nothing to add to ``MIDDLEWARE``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import NoReverseMatch, reverse

KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")

_REASONS = {405: "This endpoint does not take that method.", 413: "The request body is too large."}


def _as_json(response: HttpResponse) -> HttpResponse:
    if response.status_code < 400 or response.get("Content-Type", "").startswith("application/json"):
        return response
    detail = _REASONS.get(response.status_code) or response.reason_phrase or "Error"
    replacement = JsonResponse({"detail": detail}, status=response.status_code)
    for header in KEPT_HEADERS:
        if header in response:
            replacement[header] = response[header]
    return replacement


def _too_big() -> JsonResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return JsonResponse(
        {"detail": f"The request body is too large: this API accepts at most {limit} bytes."}, status=413
    )


def json_errors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view``, with its non-JSON error answers (405 from django-ninja, a too-large body) made JSON."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return _as_json(view(request, *args, **kwargs))
        except RequestDataTooBig:
            return _too_big()

    return wrapper


def not_found(request: HttpRequest, docs_name: str = "", **kwargs: Any) -> JsonResponse:
    """The answer for a path under the API's prefix that no endpoint serves, pointing at the documentation."""
    try:
        where = f": see {reverse(docs_name, kwargs=kwargs)} for the list" if docs_name else ""
    except NoReverseMatch:
        where = ""
    return JsonResponse({"detail": f"No such API endpoint{where}."}, status=404)
