"""What a worker may run: handlers registered by name.

A worker never imports code named by a payload. It only runs handlers that
the process registered up front (the Django integration registers the
project's Django Tasks); any other task name is refused and dead-lettered
with reason ``unknown_task``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.jobs.backoff import BackoffSpec, coerce_backoff
from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.jobs import progress
from chasqui_core.engine.jobs.errors import JobCancelled, is_unrecoverable


@dataclass(slots=True)
class JobContext:
    """Handed to handlers registered with ``takes_context=True``.

    Built for every job of such a handler, so it is a plain slotted class:
    a frozen dataclass's constructor costs four times as much.
    """

    job: Job
    queue: str
    worker_id: str
    entry_id: str
    deliveries: int
    """Always 1: runs lost to crashes are charged to ``job.attempt`` when the job is picked up."""
    max_attempts: int = 0
    """The job's budget of runs, from the job, its task or the worker (0: not known)."""
    run: Any = None
    """The delivery being run (outcomes.Delivery), where a cancel request is flagged; None outside a worker."""

    @property
    def cancelled(self) -> bool:
        """Whether someone asked for this job to be cancelled while it runs (cancel.py).

        An async run is cancelled for it anyway; a sync run should check this
        between steps and stop (``check_cancelled``): past the worker's grace
        it is given up like a run past its timeout.
        """
        run = self.run
        return run is not None and run.cancel_requested > 0

    def run_returned(self) -> None:
        """The task's own code has returned or raised: a wrapper (Django's task runner) says so before its signals
        and logging run, so that a crash of the process while they do is not charged as a run lost under way
        (the end is noted on the host now, the mark struck when the handler returns; Delivery.note_end)."""
        run = self.run
        if run is not None:
            run.note_end()

    def check_cancelled(self) -> None:
        """Raise ``JobCancelled`` if this job was cancelled: the run ends, recorded as cancelled, not retried."""
        if self.cancelled:
            raise JobCancelled("the job was cancelled while it ran; it stopped when it checked")

    def report_progress(self, value: float, message: str = "") -> None:
        """Say how far this run has got: a number (a percentage, or items done) and a short message.

        Cheap enough for a tight loop: the worker writes the latest report of
        each job at most twice a second (progress.py).
        """
        progress.report(self.worker_id, self.queue, self.job.id, value, message)

    @property
    def attempt(self) -> int:
        """1-based number of this run, counting runs lost to crashes."""
        return self.job.attempt + self.deliveries

    def will_retry(self, exc: BaseException) -> bool:
        """Would this run, failing with ``exc``, be followed by another run?

        Lets code around a handler tell a last failure (the job is finished)
        from one the worker will retry, before the worker settles it.
        """
        if isinstance(exc, JobCancelled) or self.cancelled:  # a cancelled job is never run again
            return False
        return not is_unrecoverable(exc) and self.attempt < self.max_attempts


@dataclass(frozen=True, slots=True)
class Handler:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    takes_context: bool = False
    max_attempts: int | None = None
    backoff: BackoffSpec | None = None
    timeout: float | None = None
    """Seconds a run may take; None defers to the worker's default (a job's own timeout wins over both)."""


TIMEOUT_META = "timeout"
"""The key of a job's own timeout (seconds) in its envelope's ``meta``: ``Queue.add(timeout=...)``."""


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """A timeout in seconds, or None; anything else raises ValueError in words."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 366 * 24 * 3600:
        raise ValueError(f"{name} must be a number of seconds above 0 (and below a year), got {value!r}")
    return float(value)


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        takes_context: bool = False,
        max_attempts: int | None = None,
        backoff: BackoffSpec | int | dict[str, Any] | str | None = None,
        is_async: bool | None = None,
        timeout: float | None = None,
    ) -> Handler:
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                         or max_attempts < 1):
            raise ValueError(f"max_attempts for {name!r} must be a whole number of 1 or more, got {max_attempts!r}")
        handler = Handler(
            name=name,
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn) if is_async is None else is_async,
            takes_context=takes_context,
            max_attempts=max_attempts,
            backoff=coerce_backoff(backoff),
            timeout=check_timeout(timeout, f"timeout for {name!r}"),
        )
        self._handlers[name] = handler
        return handler

    def task(self, name: str | None = None, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of ``register`` for plain-Python users of the engine."""

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(name or f"{fn.__module__}.{fn.__qualname__}", fn, **options)
            return fn

        return decorate

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[Handler]:
        return iter(self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)
