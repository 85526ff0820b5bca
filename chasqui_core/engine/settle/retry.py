"""The attempt rules: whether a job may start, and what follows a failed run.

The budget is ``max_attempts`` total runs (default 3), taken from the job
first, then its task, then the worker. A job's envelope says how many runs it
has made (``attempt``); a run lost with its worker is charged as one when the
job is picked up again (recovery.py). The rules are applied in two places
only, both here: ``at_pickup`` before a job starts (as Oban checks attempt <
max_attempts at fetch), and ``decide`` after a run fails. An exception named
``UnrecoverableError`` (its class or any base) skips the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core.engine.jobs.backoff import DEFAULT_BACKOFF, BackoffSpec, coerce_backoff
from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.jobs.errors import JobCancelled, RetryAfter, is_unrecoverable
from chasqui_core.engine.jobs.registry import Handler

DEFAULT_MAX_ATTEMPTS = 3

PANIC_AFTER_DEATHS = 2
"""A job that was running when this many workers died is a poison pill: dead-lettered as ``panic``."""

RECOVERIES_BEFORE_PANIC = 5
"""A job taken back from this many dead workers is a poison pill even if none was known to be running it: an
async job that kills its process before its first ``await`` is never written to the start journal. Only workers
whose death is on record count; one that only lost contact does not (reclaim.lua)."""

CLOCK_AHEAD_MS = 24 * 3600 * 1000
"""A job created further than this in the future (by its producer's clock) is not a job anyone sent."""


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
    """DLQ reason when not retrying: ``retries_exhausted``, ``unrecoverable`` or ``cancelled``."""


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
    if isinstance(exc, JobCancelled):  # asked for by someone: never retried (cancel.py)
        return Decision(False, reason="cancelled")
    if is_unrecoverable(exc):
        return Decision(False, reason="unrecoverable")
    if runs_made >= budget(job, handler, policy):
        return Decision(False, reason="retries_exhausted")
    if isinstance(exc, RetryAfter):  # the server named its wait: honoured whatever the job's strategy
        return Decision(True, max(0, round(exc.seconds * 1000)))
    previous = job.errors[-1].get("backoff_ms") if job.errors else None
    spec = backoff_for(job, handler, policy)
    return Decision(True, spec.delay_ms(runs_made, error=exc, previous_ms=previous))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job picked up must not start: the DLQ reason, an error class and the words for it."""

    reason: str
    error_class: str
    error: str


def at_pickup(job: Job, max_attempts: int, *, lost: int, now: int, recovered: int = 0) -> Refusal | None:
    """May ``job`` start now? ``lost`` runs of it ended with their workers' silence and were just charged to it
    (as deaths, or as lost contact: recovery.py); ``recovered``: from how many workers its stream entry was taken
    back uncharged or charged a death.

    A job charged a lost run that has now died with ``PANIC_AFTER_DEATHS``
    workers is a poison pill (lost contact adds no death, so it never makes
    one); one with no run left ends with the lost run as its last error.
    Every run a job makes leaves a line in its error history (a failure, a
    lost run), so an envelope that counts more runs than its
    history records, or was created in the future, was not written by a
    producer or a retry: it is refused as ``invalid``, not run. A retry that
    finds its budget spent was written under a larger one (a deploy lowered
    ``max_attempts``): ``retries_exhausted``, as if its last run had been the
    last allowed, since the count of runs is the one thing that says so.
    """
    if recovered >= RECOVERIES_BEFORE_PANIC:
        return Refusal("panic", "WorkerLost", f"the job was taken back from {recovered} workers that died or "
                                              "stopped answering while they held it (one that kills its worker "
                                              "before it could be noted running?)")
    if lost:
        if job.deaths >= PANIC_AFTER_DEATHS:
            return Refusal("panic", "WorkerLost", f"the job was running when its worker died {job.deaths} times")
        if job.attempt >= max_attempts:
            last = job.errors[-1].get("class") if job.errors else None
            if last == "LostContact":
                return Refusal("retries_exhausted", "LostContact", f"contact with its worker was lost during run "
                                                                   f"{job.attempt} of {max_attempts}; no run is left")
            return Refusal("retries_exhausted", "WorkerLost",
                           f"its worker died during run {job.attempt} of {max_attempts}; no run is left")
        return None
    if job.attempt > len(job.errors):
        return Refusal("invalid", "InvalidEnvelope",
                       f"the envelope says {job.attempt} runs were made, and its error history records "
                       f"{len(job.errors)}")
    if job.attempt >= max_attempts:
        last = job.errors[-1].get("class") if job.attempt else None
        return Refusal("retries_exhausted", last if isinstance(last, str) and last else "RetriesExhausted",
                       f"its budget is now {max_attempts} runs and it has made {job.attempt}: no run is left "
                       "(the budget was lowered since it was retried)")
    if job.created_at > now + CLOCK_AHEAD_MS:
        return Refusal("invalid", "InvalidEnvelope",
                       f"created_at {job.created_at} is more than a day ahead of this worker's clock ({now})")
    return None
