"""Exceptions a handler raises to steer what happens to its job, and errors the
engine raises to its callers.

Handlers may raise any exception; these two change the outcome:

* ``UnrecoverableError`` skips the retry budget: the job goes straight to the
  dead-letter queue with reason ``unrecoverable``. The worker recognises *any*
  exception whose class, or one of its bases, is named ``UnrecoverableError``,
  so another library's class of that name works too.
* ``RetryAfter(seconds)`` asks for the next attempt after a given time (for an
  HTTP 429, say). The ``retry_after`` backoff strategy honours it.
"""

from __future__ import annotations

from typing import Any


class ChasquiError(Exception):
    """Base class of the errors the engine raises to its callers."""


class UnrecoverableError(Exception):
    """Raise from a handler when retrying cannot help (bad data, gone resource)."""


class RetryAfter(Exception):
    """Raise from a handler to ask for the next attempt ``seconds`` from now."""

    def __init__(self, seconds: float, message: str = "") -> None:
        if seconds < 0:
            raise ValueError(f"RetryAfter needs a delay of 0 seconds or more, got {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(message or f"retry after {self.seconds:g}s")


class JobTimeout(Exception):
    """A run passed its timeout: an async job is cancelled, a sync job's thread is abandoned.

    Recorded as the run's error and retried by the job's budget like any
    failure (not unrecoverable: a timeout is often a slow dependency).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"the job ran past its timeout of {seconds:g} s")


class JobCancelled(Exception):
    """The job was cancelled (``cancel.request``): raised in a run by ``JobContext.check_cancelled()``, and the
    error recorded for a job cancelled before or while it ran. Never retried: the job goes to the dead-letter
    queue with reason ``cancelled`` (see docs/flow-control.md)."""

    def __init__(self, message: str = "the job was cancelled") -> None:
        super().__init__(message)


class JobNotFound(ChasquiError):
    """The job or entry asked for is not (or no longer) there."""


class InvalidQueueName(ChasquiError, ValueError):
    """A queue name that cannot be used as part of a Redis key."""


class RedisConfigError(ChasquiError, ValueError):
    """A Redis URL or connection option that cannot work, named in the message (its password masked).

    A cluster URL with a database other than 0, TLS files that are not there,
    credentials the server refuses: raised when the first connection is made,
    so a process fails at start with this message rather than later with a
    lower-level one.
    """


class EnqueueUnavailable(ChasquiError):
    """Redis could not take an add within the producer's retry window.

    Raised instead of redis-py's connection errors once the producer has
    retried for ``retry_for`` seconds. ``maybe_added`` is False when no attempt
    reached the server (refused connections, a server still loading), so
    nothing was added; True when a write was sent and its reply lost, so the
    jobs may be there. ``added`` holds the results of the chunks of a bulk add
    that went through before the failure.
    """

    def __init__(self, message: str, *, server: str, cause: BaseException, job_ids: list[str],
                 maybe_added: bool, added: list[Any] | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.cause = cause
        self.job_ids = job_ids
        self.maybe_added = maybe_added
        self.added = added if added is not None else []


_UNRECOVERABLE_BY_CLASS: dict[type[BaseException], bool] = {}
"""The answer per exception class: asked on every failed run, and a job fails the same way many times."""
_UNRECOVERABLE_BY_CLASS_SIZE = 1024


def is_unrecoverable(exc: BaseException) -> bool:
    """True when the exception's class or any base class is named UnrecoverableError."""
    cls = type(exc)
    known = _UNRECOVERABLE_BY_CLASS.get(cls)
    if known is None:
        known = any(base.__name__ == "UnrecoverableError" for base in cls.__mro__)
        if len(_UNRECOVERABLE_BY_CLASS) >= _UNRECOVERABLE_BY_CLASS_SIZE:  # classes made on the fly: stay bounded
            _UNRECOVERABLE_BY_CLASS.clear()
        _UNRECOVERABLE_BY_CLASS[cls] = known
    return known
