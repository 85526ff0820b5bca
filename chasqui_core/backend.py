"""The django.tasks backend: Django's ``@task`` on top of the Chasqui engine.

``@task(queue_name="emails", max_attempts=5, backoff=...)`` creates a
``ChasquiTask``; Django hands the extra keyword arguments to our task class.
Each such task registers itself by its module path, and that registry is the
only thing a worker will run: a payload naming anything else is refused,
never imported.
"""

from __future__ import annotations

import logging
from inspect import iscoroutinefunction
from dataclasses import dataclass, replace
from datetime import datetime, timezone as dt_timezone
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connection, transaction
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.backoff import BackoffSpec, coerce_backoff
from chasqui_core.engine.connection import connect
from chasqui_core.engine.envelope import now_ms
from chasqui_core.engine.keys import QueueKeys
from chasqui_core.engine.queue import JobSpec, Queue
from chasqui_core.engine.registry import HandlerRegistry, JobContext
from chasqui_core.engine.results import decode_result, encode_result

logger = logging.getLogger("chasqui.backend")

TASK_REGISTRY: dict[str, "ChasquiTask"] = {}
"""Every ChasquiTask defined in this process, by module path."""


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

    def __post_init__(self) -> None:
        for name in ("max_attempts", "job_attempts"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidTask(f"{name} must be a whole number of 1 or more, got {value!r}")
        for name in ("backoff", "job_backoff"):
            try:
                coerce_backoff(getattr(self, name))
            except (TypeError, ValueError) as exc:
                raise InvalidTask(f"{name} is not valid: {exc}") from None
        Task.__post_init__(self)
        TASK_REGISTRY.setdefault(self.module_path, self)

    def using(self, *, priority=None, queue_name=None, run_after=None, backend=None,
              attempts: int | None = None, backoff: Any = None, job_id: str | None = None) -> "ChasquiTask":
        """Django's ``using`` plus per-job options: ``attempts``, ``backoff``, ``job_id``."""
        task = Task.using(self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend)
        changes: dict[str, Any] = {}
        if attempts is not None:
            changes["job_attempts"] = attempts
        if backoff is not None:
            changes["job_backoff"] = backoff
        if job_id is not None:
            changes["job_id"] = job_id
        return replace(task, **changes) if changes else task


def _ms_to_dt(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=dt_timezone.utc) if ms else None


class ChasquiBackend(BaseTaskBackend):
    task_class = ChasquiTask
    supports_defer = True
    supports_async_task = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        self.result_ttl = options.pop("RESULT_TTL", 0)
        self.enqueue_on_commit = options.pop("ENQUEUE_ON_COMMIT", False)
        self.outbox = options.pop("OUTBOX", False)
        if options:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown key(s) {', '.join(sorted(options))}; "
                "known keys: ENQUEUE_ON_COMMIT, OUTBOX, RESULT_TTL (engine settings go in settings.CHASQUI)"
            )
        if isinstance(self.result_ttl, bool) or not isinstance(self.result_ttl, int) or self.result_ttl < 0:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['RESULT_TTL'] must be a number of seconds (0 turns result storage off)"
            )
        self.supports_get_result = self.result_ttl > 0
        self._client = None
        self._queues: dict[str, Queue] = {}

    # --- plumbing -----------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            self._client = connect(chasqui_settings().redis_url)
        return self._client

    def reset_connections(self) -> None:
        """Forget clients and queues, so the next call connects with the current settings."""
        self._client = None
        self._queues = {}

    def queue(self, name: str) -> Queue:
        queue = self._queues.get(name)
        if queue is None:
            conf = chasqui_settings()
            queue = self._queues[name] = Queue(name, redis_client=self.client, max_payload_bytes=conf.MAX_PAYLOAD_BYTES, retry_for=conf.ENQUEUE_RETRY_SECONDS)
        return queue

    def _options(self, task: Task) -> dict[str, Any]:
        options: dict[str, Any] = {"run_at": task.run_after, "result_ttl": self.result_ttl,
                                   "meta": {"backend": self.alias}}
        if isinstance(task, ChasquiTask):
            options.update(job_id=task.job_id, attempts=task.job_attempts, backoff=task.job_backoff)
        return options

    def _result(self, task: Task, job_id: str, args, kwargs) -> TaskResult:
        return TaskResult(
            task=task, id=job_id, status=TaskResultStatus.READY, enqueued_at=None, started_at=None,
            finished_at=None, last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
            backend=self.alias, errors=[], worker_ids=[],
        )

    def _store_ready(self, queue: Queue, job_id: str, task: Task, args, kwargs) -> None:
        if self.result_ttl:
            blob = encode_result(job_id=job_id, task=task.module_path, status="READY", args=args,
                                 kwargs=dict(kwargs), enqueued_at=now_ms())
            queue.redis.set(queue.keys.result + job_id, blob, px=self.result_ttl * 1000, nx=True)

    # --- enqueue ---------------------------------------------------------------------

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        self.validate_task(task)
        queue = self.queue(task.queue_name)
        # validated and encoded now, even when sent later: bad input fails in the caller
        built = queue.build(JobSpec(task.module_path, args, kwargs, **self._options(task)))
        result = self._result(task, built[3], args, kwargs)

        def send() -> None:
            queue.add_built(built)
            self._sent(queue, task, args, kwargs, result)

        if connection.in_atomic_block and self.outbox:
            self._to_outbox(queue, built, task, args, kwargs, result)
        elif connection.in_atomic_block and self.enqueue_on_commit:
            transaction.on_commit(send)
        else:
            send()
        return result

    def _sent(self, queue: Queue, task: Task, args, kwargs, result: TaskResult) -> None:
        self._store_ready(queue, result.id, task, args, kwargs)
        object.__setattr__(result, "enqueued_at", timezone.now())
        task_enqueued.send(type(self), task_result=result)

    def _to_outbox(self, queue: Queue, built, task: Task, args, kwargs, result: TaskResult) -> None:
        from chasqui_core.models import OutboxEntry
        from chasqui_core.outbox import relay_after_commit

        uid, when, payload, job_id = built
        if when.startswith("+"):  # relative delays count from now, not from the relay
            when = "@" + str(now_ms() + int(when[1:]))
        row = OutboxEntry.objects.create(queue=queue.name, job_id=job_id, payload=payload, when=when)

        def after_commit() -> None:
            relay_after_commit(row.id)
            self._sent(queue, task, args, kwargs, result)

        transaction.on_commit(after_commit)

    async def aenqueue(self, task: Task, args, kwargs) -> TaskResult:
        if self.enqueue_on_commit or self.outbox or self.result_ttl:
            return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)
        self.validate_task(task)
        queue = self.queue(task.queue_name)
        enqueued = await queue.aadd(task.module_path, args, kwargs, **self._options(task))
        result = self._result(task, enqueued.job_id, args, kwargs)
        object.__setattr__(result, "enqueued_at", timezone.now())
        await task_enqueued.asend(type(self), task_result=result)
        return result

    # --- results -------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        if not self.supports_get_result:
            raise NotImplementedError(
                "Result storage is off for this backend: set TASKS[...]['OPTIONS']['RESULT_TTL'] to a number of seconds"
            )
        pipe = self.client.pipeline(transaction=False)
        names = sorted(self.queues)
        for name in names:
            pipe.get(QueueKeys.for_queue(name).result + result_id)
        for blob in pipe.execute():
            if blob:
                return self._decode_result(result_id, blob)
        raise TaskResultDoesNotExist(result_id)

    def _decode_result(self, result_id: str, blob: bytes) -> TaskResult:
        data = decode_result(blob)
        discover_tasks()
        task = TASK_REGISTRY.get(data["task"])
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id} belongs to task {data['task']!r}, unknown to this project")
        errors = _task_errors(data.get("errors", []))
        worker_ids = [e.get("worker", "") for e in data.get("errors", [])]
        if data.get("status") == "SUCCESSFUL":
            worker_ids.append(data.get("worker", ""))
        result = TaskResult(
            task=task, id=result_id, status=TaskResultStatus(data["status"]),
            enqueued_at=_ms_to_dt(data.get("enqueued_at")), started_at=_ms_to_dt(data.get("started_at")),
            finished_at=_ms_to_dt(data.get("finished_at")) if data["status"] in ("SUCCESSFUL", "FAILED") else None,
            last_attempted_at=_ms_to_dt(data.get("last_attempted_at")), args=data.get("args", []),
            kwargs=data.get("kwargs", {}), backend=self.alias, errors=errors, worker_ids=worker_ids,
        )
        object.__setattr__(result, "_return_value", data.get("return_value"))
        return result

    # --- the worker side ------------------------------------------------------------------

    def check(self, **kwargs):
        try:
            chasqui_settings()
        except ImproperlyConfigured as exc:
            from django.core.checks import Error

            return [Error(str(exc), id="chasqui.E001")]
        return []


_discovered = False


def discover_tasks() -> dict[str, ChasquiTask]:
    """Import every installed app's ``tasks`` module, so its tasks register."""
    global _discovered
    if not _discovered:
        autodiscover_modules("tasks")
        _discovered = True
    return TASK_REGISTRY


def _task_errors(records: list[dict[str, Any]]) -> list[TaskError]:
    """The engine's error history as Django's TaskError list."""
    return [TaskError(exception_class_path=e.get("class", ""), traceback=e.get("traceback", "")) for e in records]


def _running_result(task: Task, ctx: JobContext) -> TaskResult:
    now = timezone.now()
    job = ctx.job
    result = TaskResult(
        task=task, id=job.id, status=TaskResultStatus.RUNNING, enqueued_at=_ms_to_dt(job.created_at),
        started_at=now, finished_at=None, last_attempted_at=now, args=job.args, kwargs=job.kwargs,
        backend=job.meta.get("backend", "default"),
        errors=_task_errors(job.errors),
        worker_ids=[e.get("worker", "") for e in job.errors] + [""] * (ctx.deliveries - 1) + [ctx.worker_id],
    )
    return result


def build_registry() -> HandlerRegistry:
    """The handlers a worker may run: the project's Django Tasks, nothing else."""
    registry = HandlerRegistry()
    for name, task in discover_tasks().items():
        registry.register(name, _handler(task), takes_context=True, max_attempts=task.max_attempts,
                          backoff=task.backoff)
    return registry


def _handler(task: ChasquiTask):
    """Wrap a Django Task for the engine: context, signals, and DB connection hygiene."""
    sender = ChasquiBackend

    if iscoroutinefunction(task.func):
        async def run_async(ctx: JobContext, *args, **kwargs):
            result = _running_result(task, ctx)
            await task_started.asend(sender, task_result=result)
            try:
                if task.takes_context:
                    value = await task.func(TaskContext(task_result=result), *args, **kwargs)
                else:
                    value = await task.func(*args, **kwargs)
            except Exception:
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
                await task_finished.asend(sender, task_result=result)
                raise
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "finished_at", timezone.now())
            await task_finished.asend(sender, task_result=result)
            return value

        return run_async

    def run_sync(ctx: JobContext, *args, **kwargs):
        # The thread runs many jobs; like a request, each job starts and ends by
        # dropping connections that are broken or past CONN_MAX_AGE.
        close_old_connections()
        result = _running_result(task, ctx)
        try:
            task_started.send(sender, task_result=result)
            try:
                if task.takes_context:
                    value = task.func(TaskContext(task_result=result), *args, **kwargs)
                else:
                    value = task.func(*args, **kwargs)
            except Exception:
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
                task_finished.send(sender, task_result=result)
                raise
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "finished_at", timezone.now())
            task_finished.send(sender, task_result=result)
            return value
        finally:
            close_old_connections()

    return run_sync
