"""Every answer under /api/ is JSON, errors included.

django-ninja answers the errors of its own endpoints in JSON. What happens
around them does not pass through it: a body over Django's upload limit, a
path no endpoint serves, a method an endpoint does not take. This middleware
gives those the API's error shape, ``{"detail": "..."}``, with the same
status, so a script never has to parse an HTML error page.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

_REASONS = {404: "No such API endpoint: see /api/docs for the list.",
            405: "This endpoint does not take that method.",
            413: "The request body is too large."}


class JsonErrorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith("/api/") or response.status_code < 400:
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        detail = _REASONS.get(response.status_code) or response.reason_phrase or "Error"
        replacement = JsonResponse({"detail": detail}, status=response.status_code)
        for header in ("Allow", "Retry-After", "WWW-Authenticate"):
            if header in response:
                replacement[header] = response[header]
        return replacement

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if request.path.startswith("/api/") and isinstance(exception, RequestDataTooBig):
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            return JsonResponse({"detail": f"The request body is too large: this API accepts at most {limit} bytes."},
                                status=413)
        return None

