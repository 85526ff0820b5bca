"""``ChasquiTask``, the task class Django's ``@task`` creates with this backend, and the registry of them.

Each ChasquiTask registers itself by its module path when it is defined; that
registry is the only thing a worker will run (a payload naming anything else is
refused, never imported). The class lives apart from the backend because the
services, the scheduler and the task runner need it without the backend's
enqueue machinery; it knows the backend only as ``BatchBackend``, the one kind
that sends a batch in chunks.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.tasks import Task, TaskResult, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask
from django.utils.module_loading import autodiscover_modules

from chasqui_core.engine.jobs import idempotency
from chasqui_core.engine.jobs.backoff import BackoffSpec, coerce_backoff
from chasqui_core.engine.jobs.envelope import MAX_RESULT_TTL
from chasqui_core.engine.jobs.registry import check_timeout

TASK_REGISTRY: dict[str, ChasquiTask] = {}
"""Every ChasquiTask defined in this process, by module path."""

class BatchBackend(BaseTaskBackend):
    """A backend that enqueues a whole batch in chunks (ChasquiBackend); any other gets one enqueue per call."""

    @abstractmethod
    def enqueue_many(self, task: Task, calls: Iterable[tuple[Any, Any]]) -> list[TaskResult]: ...

    @abstractmethod
    async def aenqueue_many(self, task: Task, calls: Iterable[tuple[Any, Any]]) -> list[TaskResult]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ChasquiTask(Task):
    max_attempts: int | None = None
    """Task-wide budget of runs (first run included); None defers to the worker."""
    backoff: BackoffSpec | int | dict | str | None = None
    """Task-wide backoff; an int means fixed milliseconds."""
    job_attempts: int | None = None
    """Per-job override of max_attempts, set with ``.using(attempts=...)``."""
    job_backoff: BackoffSpec | int | dict | str | None = None
    """Per-job override of backoff, set with ``.using(backoff=...)``."""
    job_id: str | None = None
    """Caller-given job id, for idempotent enqueue: ``.using(job_id=...)``."""
    job_result_ttl: int | None = None
    """Per-job override of the backend's RESULT_TTL (seconds), set with ``.using(result_ttl=...)``."""
    idempotency_key: str | bool | None = None
    """Guards execution: a job whose key already completed is acknowledged, not run again. A string, or
    True for the job's own id: ``.using(idempotency_key=...)``, or ``@task(idempotency_key=True)``."""
    idempotency_ttl: int | None = None
    """Seconds its completed key is remembered; None: settings.CHASQUI['IDEMPOTENCY_TTL']."""
    timeout: float | None = None
    """Seconds a run may take (an async run is cancelled, a sync run's process replaced); None: the worker's
    default (``runworker --timeout`` or settings.CHASQUI['JOB_TIMEOUT'])."""
    job_timeout: float | None = None
    """Per-job override of timeout, set with ``.using(timeout=...)``."""
    limit_key: str | None = None
    """The bucket this job takes in its keyed rate and concurrency limits (settings.CHASQUI['LIMITS']), over
    the value of their ``key`` argument: ``.using(limit_key=...)``."""

    def __post_init__(self) -> None:
        for name in ("max_attempts", "job_attempts"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidTask(f"{name} must be a whole number of 1 or more, got {value!r}")
        ttl = self.job_result_ttl
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_RESULT_TTL):
            raise InvalidTask(f"result_ttl must be a whole number of seconds from 0 to {MAX_RESULT_TTL}, got {ttl!r}")
        for name in ("timeout", "job_timeout"):
            try:
                check_timeout(getattr(self, name), name)
            except ValueError as exc:
                raise InvalidTask(str(exc)) from None
        if self.limit_key is not None and (not isinstance(self.limit_key, str) or not 0 < len(self.limit_key) <= 200):
            raise InvalidTask(f"limit_key must be a non-empty string of at most 200 characters, got {self.limit_key!r}")
        for name in ("backoff", "job_backoff"):
            try:
                coerce_backoff(getattr(self, name))
            except (TypeError, ValueError) as exc:
                raise InvalidTask(f"{name} is not valid: {exc}") from None
        try:
            if not isinstance(self.idempotency_key, bool | None):
                idempotency.check_key(self.idempotency_key)
            if self.idempotency_ttl is not None:
                idempotency.check_ttl(self.idempotency_ttl)
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None
        Task.__post_init__(self)
        TASK_REGISTRY.setdefault(self.module_path, self)

    def using(self, *, priority=None, queue_name=None, run_after=None, backend=None,
              attempts: int | None = None, backoff: Any = None, job_id: str | None = None,
              result_ttl: int | None = None, idempotency_key: str | bool | None = None,
              idempotency_ttl: int | None = None, timeout: float | None = None,
              limit_key: str | None = None) -> ChasquiTask:
        """Django's ``using`` plus per-job options: ``attempts``, ``backoff``, ``job_id``, ``result_ttl``,
        ``idempotency_key``, ``idempotency_ttl``, ``timeout``, ``limit_key``."""
        task = Task.using(self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend)
        changes: dict[str, Any] = {}
        if attempts is not None:
            changes["job_attempts"] = attempts
        if backoff is not None:
            changes["job_backoff"] = backoff
        if job_id is not None:
            changes["job_id"] = job_id
        if result_ttl is not None:
            changes["job_result_ttl"] = result_ttl
        if idempotency_key is not None:
            changes["idempotency_key"] = idempotency_key
        if idempotency_ttl is not None:
            changes["idempotency_ttl"] = idempotency_ttl
        if timeout is not None:
            changes["job_timeout"] = timeout
        if limit_key is not None:
            changes["limit_key"] = limit_key
        return replace(task, **changes) if changes else task

    def get_backend(self) -> BaseTaskBackend:
        """Django's lookup, without the import statement Django runs inside it on every enqueue."""
        return task_backends[self.backend]

    def enqueue_many(self, calls: Iterable[tuple[Any, Any]]) -> list[TaskResult]:
        """Enqueue one job per ``(args, kwargs)`` pair: one round trip per chunk of jobs.

        Returns the TaskResults in the order of ``calls``. A bad call raises
        before anything is sent, naming its index.
        """
        backend = self.get_backend()
        if isinstance(backend, BatchBackend):
            return backend.enqueue_many(self, calls)
        return [backend.enqueue(self, list(args), dict(kwargs)) for args, kwargs in calls]

    async def aenqueue_many(self, calls: Iterable[tuple[Any, Any]]) -> list[TaskResult]:
        """The async twin of ``enqueue_many``."""
        backend = self.get_backend()
        if isinstance(backend, BatchBackend):
            return await backend.aenqueue_many(self, calls)
        return [await backend.aenqueue(self, list(args), dict(kwargs)) for args, kwargs in calls]

_discovered = False


def discover_tasks() -> dict[str, ChasquiTask]:
    """Import every installed app's ``tasks`` module, so its tasks register."""
    global _discovered
    if not _discovered:
        autodiscover_modules("tasks")
        _discovered = True
    return TASK_REGISTRY
