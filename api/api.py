"""The NinjaAPI instance: authentication, routers, and one JSON error format.

Every error answers ``{"detail": "<what went wrong>"}`` (plus ``errors`` with
per-field problems for invalid input) with the status that says whose fault
it is: 400/422 bad input, 401 not authenticated, 403 not allowed, 404 unknown
queue/job/entry, 409 conflicting operation, 503 Redis unreachable. Input
never causes a 500: the engine's complaints about values are bad input.
"""

from __future__ import annotations

import logging

from functools import partial

from django.core.exceptions import PermissionDenied
from django.db import DataError
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, re_path
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import docs
from .audit import router as audit_router
from .batches import router as batches_router
from .auth import ApiKeyAuth, SessionAuth, TooManyAttempts
from .delayed import router as delayed_router
from .dlq import router as dlq_router
from .jobs import router as jobs_router
from .json_errors import json_errors, not_found
from .operations import router as operations_router
from .queues import router as queues_router
from .schedules import router as schedules_router
from .workers import router as workers_router
from chasqui_core.services.common import Conflict, InvalidInput, NotFound

logger = logging.getLogger("chasqui.api")

RETRY_AFTER_HEADER = {
    "description": "Seconds to wait before sending a wrong API key again; requests with a valid key are served.",
    "schema": {"type": "integer", "minimum": 1},
}


class ChasquiAPI(NinjaAPI):
    """NinjaAPI, with the ``Retry-After`` header of every 429 in the schema (ninja declares bodies only), and
    URL patterns that answer JSON for every error under the API's prefix, and serve the docs' own files
    (json_errors.py, docs.py)."""

    def _get_urls(self):
        patterns = super()._get_urls()
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = json_errors(pattern.callback)
        docs_url = self.docs_url.strip("/") if self.docs_url else "docs"
        patterns.append(path(f"{docs_url}/assets/<str:name>", docs.asset, name="docs-asset"))
        patterns.append(re_path(r"^.*$", partial(not_found, docs_name=f"{self.urls_namespace}:openapi-view"),
                                 name="not-found"))
        return patterns

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        for methods in schema.get("paths", {}).values():
            for operation in methods.values():
                too_many = operation.get("responses", {}).get(429)
                if too_many is None:
                    too_many = operation.get("responses", {}).get("429")
                if too_many is not None:
                    too_many.setdefault("headers", {})["Retry-After"] = RETRY_AFTER_HEADER
        return schema


api = ChasquiAPI(
    title="Chasqui",
    version="1",
    description=(
        "Operate Chasqui's queues: stats and metrics, enqueue, delayed jobs, the dead-letter queue "
        "(browse, group, replay, discard), workers, background operations and the audit log. "
        "Authenticate with `Authorization: Bearer <key>` (`manage.py chasqui apikey create`) or a "
        "Django session (changes need the CSRF token). See docs/api.md."
    ),
    urls_namespace="chasqui_api",
    docs_url="/docs",
    docs=docs.LocalSwagger(),
    openapi_url="/openapi.json",
    auth=[ApiKeyAuth(), SessionAuth()],
)

api.add_router("/queues", queues_router)
api.add_router("/queues", delayed_router)
api.add_router("/queues", dlq_router)
api.add_router("", jobs_router)
api.add_router("", batches_router)
api.add_router("/workers", workers_router)
api.add_router("/schedules", schedules_router)
api.add_router("/operations", operations_router)
api.add_router("/audit", audit_router)


def _error(request: HttpRequest, status: int, detail: str, **extra) -> HttpResponse:
    return api.create_response(request, {"detail": detail, **extra}, status=status)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    response = _error(request, 401, "Authentication required: log in, or send 'Authorization: Bearer <API key>'")
    response["WWW-Authenticate"] = 'Bearer realm="chasqui"'
    return response


@api.exception_handler(TooManyAttempts)
def _too_many(request, exc):
    response = _error(request, 429, str(exc))
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(PermissionDenied)
def _forbidden(request, exc):
    return _error(request, 403, str(exc) or "Permission denied")


@api.exception_handler(NotFound)
def _not_found(request, exc):
    return _error(request, 404, str(exc))


@api.exception_handler(Conflict)
def _conflict(request, exc):
    return _error(request, 409, str(exc))


@api.exception_handler(InvalidInput)
def _invalid(request, exc):
    return _error(request, 422, str(exc))


def _loc(error: dict) -> str:
    parts = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "payload", "filters", "q")]
    return ".".join(parts)


@api.exception_handler(ValidationError)
def _validation(request, exc):
    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors
    ]
    parts = [f"{_loc(e)}: {e['msg']}" if _loc(e) else e["msg"] for e in errors]
    return _error(request, 422, "Invalid input: " + "; ".join(parts), errors=errors)


@api.exception_handler(ValueError)
def _value_error(request, exc):
    # The engine words its ValueErrors for people; reaching here means a path
    # the service layer did not wrap. Logged in full in case it is a bug.
    logger.warning("Unwrapped %s on %s %s", type(exc).__name__, request.method, request.path, exc_info=exc)
    return _error(request, 422, str(exc) or "Invalid input")


@api.exception_handler(TypeError)
def _type_error(request, exc):
    logger.warning("Unwrapped TypeError on %s %s", request.method, request.path, exc_info=exc)
    return _error(request, 422, str(exc) or "Invalid input")


@api.exception_handler(OverflowError)
def _overflow(request, exc):
    return _error(request, 422, f"A number is out of range: {exc}")


@api.exception_handler(DataError)
def _data_error(request, exc):
    return _error(request, 422, f"The database cannot store this value: {exc}")


@api.exception_handler(ResponseError)
def _redis_refused(request, exc):
    return _error(request, 422, f"Redis refused the request: {exc}")


@api.exception_handler(RedisConnectionError)
def _redis_down(request, exc):
    logger.warning("Redis unreachable: %s", exc)
    return _error(request, 503, "Redis is unreachable; try again shortly")


@api.exception_handler(RedisTimeoutError)
def _redis_slow(request, exc):
    logger.warning("Redis timed out: %s", exc)
    return _error(request, 503, "Redis did not answer in time; try again shortly")
