"""What every service module needs: the errors, the permission check, input checks shared by all areas.

Kept apart from the areas so that each of them depends on this module alone
(and on ``audit`` to record its changes), never on another area.
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any, Literal

from django.core.exceptions import PermissionDenied
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTask
from redis.exceptions import ResponseError

from chasqui_core import access
from chasqui_core.backend import ChasquiBackend
from chasqui_core.engine.ops import stats
from chasqui_core.engine.jobs.errors import InvalidQueueName, JobNotFound
from chasqui_core.engine.store.keys import validate_queue_name

Source = Literal["api", "console", "cli"]
SOURCES = ("api", "console", "cli")

MAX_PAGE = 500
"""Largest page any listing returns."""


# --- errors ---------------------------------------------------------------------


class ServiceError(Exception):
    """Base of the errors the service layer raises; the message is meant for people."""


class InvalidInput(ServiceError):
    """The request cannot be carried out as given (HTTP 422)."""


class NotFound(ServiceError):
    """An unknown queue, job, dead-letter entry, operation or key (HTTP 404)."""


class Conflict(ServiceError):
    """The request clashes with the current state, e.g. cancelling a finished operation (HTTP 409)."""


# --- plumbing ---------------------------------------------------------------------


def backend() -> ChasquiBackend:
    found = task_backends["default"]
    if not isinstance(found, ChasquiBackend):
        raise TypeError("TASKS['default'] must use chasqui_core.backend.ChasquiBackend")
    return found


def redis_client():
    """The backend's shared sync Redis client (binary replies, thread-safe pool)."""
    return backend().client


def require(actor, codename: str, source: str = "api") -> None:
    """Raise PermissionDenied unless ``actor`` holds ``chasqui_core.<codename>``."""
    if actor is None and source == "cli":
        return
    if not access.has(actor, codename):
        raise PermissionDenied(
            f"Permission denied: this needs the '{access.full_name(codename)}' permission "
            f"({access.PERMISSIONS[codename]})."
        )


def check_source(source: str) -> None:
    """A wrong source is a programming error of the caller, not bad input from a person."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")


class _EngineErrors:
    """Turn the engine's complaints about input into InvalidInput / NotFound.

    The engine raises ValueError/TypeError with a clear message for bad ids,
    cursors, times and payloads; Redis itself refuses some values (a score
    that is not a number). None of those is a server fault.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or isinstance(exc, ServiceError):
            return False
        if isinstance(exc, JobNotFound):
            raise NotFound(str(exc)) from None
        if isinstance(exc, (ValueError, TypeError, OverflowError, InvalidTask)):
            raise InvalidInput(str(exc) or type(exc).__name__) from None
        if isinstance(exc, ResponseError):
            raise InvalidInput(f"Redis refused the request: {exc}") from None
        return False


engine_errors = _EngineErrors()


def page_limit(limit: Any, maximum: int = MAX_PAGE) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise InvalidInput(f"limit must be a whole number from 1 to {maximum}, got {limit!r}")
    return limit


def epoch_ms(value: datetime | int | None, name: str) -> int | None:
    """Epoch milliseconds from an aware datetime (naive means UTC) or an int of ms."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        try:
            ms = int(value.timestamp() * 1000)
        except (OverflowError, ValueError, OSError):
            raise InvalidInput(f"{name} is not a usable date: {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise InvalidInput(f"{name} must be a date and time, got {value!r}")
    if ms < 0:
        raise InvalidInput(f"{name} must not be before 1970-01-01, got {value!r}")
    return ms


# --- queue names -----------------------------------------------------------------------


def known_queues() -> list[str]:
    """The backend's configured queues plus every queue registered in Redis."""
    names = set(backend().queues) | set(stats.list_queues(redis_client()))
    return sorted(names)


def require_queue(name: Any) -> str:
    """``name`` when it is a known queue; NotFound otherwise.

    A queue exists when the backend serves it or Redis has it registered (or
    holds its stream).
    """
    if not isinstance(name, str):
        raise NotFound(f"No queue named {name!r}")
    try:
        validate_queue_name(name)
    except InvalidQueueName as exc:
        raise NotFound(f"No queue named {name!r}: {exc}") from None
    if name in backend().queues or stats.queue_exists(redis_client(), name):
        return name
    raise NotFound(f"No queue named {name!r}; known queues: {', '.join(known_queues()) or 'none'}")
