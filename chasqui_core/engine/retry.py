"""What happens to a job whose run failed: another attempt, or the DLQ.

The budget is ``max_attempts`` total runs (default 3), taken from the job
first, then its task, then the worker. Runs lost to a crashed worker count.
An exception named ``UnrecoverableError`` (its class or any base) skips the
budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backoff import DEFAULT_BACKOFF, BackoffSpec, coerce_backoff
from .envelope import Job
from .errors import is_unrecoverable
from .registry import Handler

DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Worker-wide defaults, the last of the three layers."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: BackoffSpec = DEFAULT_BACKOFF

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be a whole number of 1 or more, got {self.max_attempts!r}")


@dataclass(slots=True)
class Decision:
    """Made once per failed run: not frozen, since a frozen dataclass's constructor costs twice as much."""

    retry: bool
    delay_ms: int = 0
    reason: str = ""
    """DLQ reason when not retrying: ``retries_exhausted`` or ``unrecoverable``."""


def budget(job: Job, handler: Handler | None, policy: RetryPolicy) -> int:
    if job.max_attempts:
        return job.max_attempts
    if handler is not None and handler.max_attempts:
        return handler.max_attempts
    return policy.max_attempts


def backoff_for(job: Job, handler: Handler | None, policy: RetryPolicy) -> BackoffSpec:
    if job.backoff:
        try:
            spec = coerce_backoff(job.backoff)
        except (TypeError, ValueError):
            spec = None  # a strategy this worker does not know: fall back, do not lose the job
        if spec is not None:
            return spec
    if handler is not None and handler.backoff is not None:
        return handler.backoff
    return policy.backoff


def decide(job: Job, exc: BaseException, runs_made: int, handler: Handler | None, policy: RetryPolicy) -> Decision:
    """Decide after ``runs_made`` runs in all, the last of which raised ``exc``."""
    if is_unrecoverable(exc):
        return Decision(False, reason="unrecoverable")
    if runs_made >= budget(job, handler, policy):
        return Decision(False, reason="retries_exhausted")
    previous = job.errors[-1].get("backoff_ms") if job.errors else None
    spec = backoff_for(job, handler, policy)
    return Decision(True, spec.delay_ms(runs_made, error=exc, previous_ms=previous))
