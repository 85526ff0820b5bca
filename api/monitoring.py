"""The two endpoints that monitoring systems call: ``/metrics`` and ``/healthz``.

They are plain Django views rather than API endpoints: Prometheus wants its
text format at a path of its own, and an orchestrator's probe wants a bare
status code. ``/metrics`` shows every queue, so it asks what the API's reads
ask, the ``view_queues`` permission through an API key, checked by the API's
own key check and its limit on wrong keys; Prometheus servers listed in
``CHASQUI["METRICS_ALLOWED_IPS"]`` may scrape without a key. ``/healthz``
reveals nothing worth hiding and must work for a probe that has no key, so it
is anonymous.
"""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .auth import TooManyAttempts, user_for_key
from .client_address import client_address
from chasqui_core import access, health, prometheus, schedules
from chasqui_core.services.common import redis_client
from chasqui_core.conf import chasqui_settings

logger = logging.getLogger("chasqui.api")


def _text(status: int, message: str, **headers: str) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8", headers=headers)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read the metrics, as a response; None when it may."""
    if chasqui_settings().metrics_allowed(client_address(request)):
        return None
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _text(401, "Authentication required: send 'Authorization: Bearer <API key>' of a user with the "
                          "view_queues permission, or scrape from an address in CHASQUI['METRICS_ALLOWED_IPS'].",
                     **{"WWW-Authenticate": 'Bearer realm="chasqui"'})
    try:
        user = user_for_key(request, token, access.VIEW)
    except TooManyAttempts as exc:
        return _text(429, str(exc), **{"Retry-After": str(exc.retry_after)})
    except PermissionDenied as exc:
        return _text(403, str(exc) or "Permission denied")
    if user is None:
        return _text(401, "This API key is not valid: it is unknown or revoked, or its user is inactive.",
                     **{"WWW-Authenticate": 'Bearer realm="chasqui", error="invalid_token"'})
    return None


def _schedules() -> list:
    """The settings' schedules; none when they are invalid (the system check reports them, metrics go on)."""
    try:
        return list(schedules.configured().values())
    except ImproperlyConfigured:
        return []


def _rate_windows() -> dict[str, int]:
    """Each rate limit's window (ms) by scope, so its figure counts the starts of the current window only."""
    try:
        return {limit.scope: limit.window_ms for limit in chasqui_settings().LIMITS if limit.rate}
    except ImproperlyConfigured:
        return {}


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    try:
        body = prometheus.render(redis_client(), _schedules(), _rate_windows())
    except (RedisConnectionError, RedisTimeoutError) as exc:
        logger.warning("metrics: Redis unreachable: %s", exc)
        return _text(503, "Redis is unreachable, so there are no figures to report; try again shortly.")
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    result = health.check()
    return JsonResponse(result.as_dict(), status=200 if result.ok else 503, headers={"Cache-Control": "no-store"})
