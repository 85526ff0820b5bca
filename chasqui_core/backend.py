"""The django.tasks backend: Django's ``@task`` on top of the Chasqui engine.

``@task(queue_name="emails", max_attempts=5, backoff=...)`` creates a
``ChasquiTask``; Django hands the extra keyword arguments to our task class.
Each such task registers itself by its module path, and that registry is the
only thing a worker will run: a payload naming anything else is refused,
never imported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError
from django.db import connection, transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from chasqui_core import outbox, tracing
from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.store.connection import connect, undetected
from chasqui_core.engine.jobs.envelope import MAX_RESULT_TTL, now_ms
from chasqui_core.engine.jobs.errors import RedisConfigError
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import BuiltJob, JobSpec, JobTemplate, Queue
from chasqui_core.engine.jobs.progress import Progress
from chasqui_core.engine.jobs.progress import decode as decode_progress
from chasqui_core.engine.jobs.results import decode_result, encode_result
from chasqui_core.enqueue_calls import _count, _gc_paused, _unpack_call
from chasqui_core.task import TASK_REGISTRY, BatchBackend, ChasquiTask, discover_tasks
from chasqui_core.task_results import ms_to_datetime, ready_result, task_errors
from chasqui_core.task_results import was_cancelled as was_cancelled  # where callers have long found it
from chasqui_core.task_signals import TaskSignal

logger = logging.getLogger("chasqui.backend")



def _traced(options: dict[str, Any], carrier: dict[str, str]) -> dict[str, Any]:
    """A task's job options with the enqueue's trace context in the job's meta (a copy: the plan is shared)."""
    return {**options, "meta": tracing.with_carrier(options["meta"], carrier)}






@dataclass(frozen=True, slots=True)
class _Plan:
    """A task's share of every enqueue: its queue, its module path and its job options."""

    task: Task
    queue: Queue
    task_path: str
    options: dict[str, Any]
    template: JobTemplate
    """The options checked and encoded once: an enqueue then checks and packs only its arguments."""


class ChasquiBackend(BatchBackend):
    task_class = ChasquiTask
    supports_defer = True
    supports_async_task = True
    supports_priority = True
    """Priorities map to three bands per queue (high above 0, default, low below 0): see engine/jobs/priority.py."""

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
        if (isinstance(self.result_ttl, bool) or not isinstance(self.result_ttl, int)
                or not 0 <= self.result_ttl <= MAX_RESULT_TTL):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['RESULT_TTL'] must be a number of seconds up to {MAX_RESULT_TTL} "
                "(0 turns result storage off)"
            )
        self.supports_get_result = self.result_ttl > 0
        self._client = None
        self._queues: dict[str, Queue] = {}
        self._outbox_queues: dict[str, Queue] = {}
        self._plans: dict[int, _Plan] = {}

    # --- plumbing -----------------------------------------------------------------

    @property
    def client(self):
        """The shared client: plain, a Redis Cluster's or a Sentinel master's, as ``REDIS_URL`` turns out to be.

        Whether the URL is a cluster's is asked when the client is first
        made. While Redis does not answer that cannot be known: a plain
        client serves the call (it fails, or rides out the outage within the
        producer's retry window, as it always did) and is not kept, so the
        next call asks again.
        """
        if self._client is None:
            conf = chasqui_settings()
            if conf.redis_url_problem is not None:  # a process that ran no system checks (chasqui.E003)
                raise ImproperlyConfigured(conf.redis_url_problem)
            try:
                client = connect(conf.redis_url)
            except RedisConfigError as exc:  # credentials refused, a database on a cluster...
                raise ImproperlyConfigured(f"{conf.redis_url_setting}: {exc}") from None
            if undetected(client):
                return client
            self._client = client
        return self._client

    def reset_connections(self) -> None:
        """Forget clients and queues, so the next call connects with the current settings."""
        for queue in [*self._queues.values(), *self._outbox_queues.values()]:
            queue.close()
        self._client = None
        self._queues = {}
        self._outbox_queues = {}
        self._plans = {}

    def queue(self, name: str) -> Queue:
        queue = self._queues.get(name)
        if queue is None:
            conf = chasqui_settings()
            queue = self._new_queue(name, conf.ENQUEUE_RETRY_SECONDS)
            if self._client is not None:  # else Redis did not answer yet: a queue for this call only
                self._queues[name] = queue
        return queue

    def outbox_queue(self, name: str) -> Queue:
        """A queue for the outbox's relay right after a commit: one try, no waiting out an outage.

        The committed rows already hold the jobs and every worker relays what
        is left, so a request must not stall for ENQUEUE_RETRY_SECONDS while
        Redis is down.
        """
        queue = self._outbox_queues.get(name)
        if queue is None:
            queue = self._new_queue(name, 0)
            if self._client is not None:
                self._outbox_queues[name] = queue
        return queue

    def _new_queue(self, name: str, retry_for: float) -> Queue:
        conf = chasqui_settings()
        return Queue(name, redis_client=self.client, max_payload_bytes=conf.MAX_PAYLOAD_BYTES, retry_for=retry_for,
                     signing_key=conf.SIGNING_KEYS[0] if conf.SIGNING_KEYS else None,
                     idempotency_ttl=conf.IDEMPOTENCY_TTL)

    def _options(self, task: Task) -> dict[str, Any]:
        options: dict[str, Any] = {"run_at": task.run_after, "result_ttl": self.result_ttl,
                                   "meta": {"backend": self.alias}, "priority": task.priority}
        if isinstance(task, ChasquiTask):
            options.update(job_id=task.job_id, attempts=task.job_attempts, backoff=task.job_backoff,
                           idempotency_key=task.idempotency_key, idempotency_ttl=task.idempotency_ttl,
                           timeout=task.job_timeout, limit_key=task.limit_key)
            if task.job_result_ttl is not None:
                options["result_ttl"] = task.job_result_ttl
        return options

    def _plan(self, task: Task) -> _Plan:
        """What every enqueue of ``task`` shares: validated once, its queue and its job options.

        A task is immutable, so all of it holds for the backend's life (until
        ``reset_connections``); an enqueue then pays only for its own job.
        """
        plan = self._plans.get(id(task))
        if plan is not None and plan.task is task:
            return plan
        self.validate_task(task)
        queue = self.queue(task.queue_name)
        options = self._options(task)
        plan = _Plan(task, queue, task.module_path, options, queue.template(JobSpec(task.module_path, **options)))
        if queue is self._queues.get(task.queue_name):  # else a stand-in while Redis is down: not kept
            if len(self._plans) >= 1024:
                self._plans.clear()
            self._plans[id(task)] = plan
        return plan

    def job_spec(self, task: Task, args, kwargs) -> tuple[Queue, JobSpec]:
        """The queue and the engine's JobSpec an enqueue of ``task`` would send (its options kept): a workflow
        builds its steps with this, then sends them together (chasqui_core/flows.py)."""
        plan = self._plan(task)
        return plan.queue, JobSpec(plan.task_path, args, kwargs, **plan.options)

    def _result(self, task: Task, job_id: str, args, kwargs) -> TaskResult:
        return ready_result(task, job_id, args, kwargs, self.alias)

    def _store_ready(self, queue: Queue, task: Task, results: list[TaskResult]) -> None:
        """Record READY outcomes for ``get_result()``, one pipelined write for the batch."""
        now = now_ms()
        pipe = queue.redis.pipeline(transaction=False)
        for result in results:
            blob = encode_result(job_id=result.id, task=task.module_path, status="READY", args=result.args,
                                 kwargs=result.kwargs, enqueued_at=now)
            pipe.set(queue.keys.result + result.id, blob, px=self.result_ttl * 1000, nx=True)
        pipe.execute()

    # --- enqueue ---------------------------------------------------------------------

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        """One job: ``enqueue_many``'s checks and semantics without a batch's bookkeeping."""
        if tracing.enabled():
            with tracing.enqueue_span(task.queue_name, task.module_path) as (span, carrier):
                result = self._enqueue(task, args, kwargs, carrier)
                tracing.enqueued(span, [result.id])
                return result
        return self._enqueue(task, args, kwargs, None)

    def _enqueue(self, task: Task, args, kwargs, carrier: dict[str, str] | None) -> TaskResult:
        plan = self._plan(task)
        queue = plan.queue
        if carrier is None:
            job = plan.template.build(args, kwargs)
        else:
            job = queue.build(JobSpec(plan.task_path, args, kwargs, **_traced(plan.options, carrier)))
        result = self._result(task, job.job_id, args, kwargs)
        if (self.outbox or self.enqueue_on_commit) and connection.in_atomic_block:
            self._defer(queue, task, [job], [result])
        else:
            queue.add_built(job)
            self._sent(queue, task, [result])
        return result

    def enqueue_many(self, task: Task, calls: Iterable[tuple[Any, Any]], *, _one: bool = False) -> list[TaskResult]:
        """Enqueue one job per ``(args, kwargs)`` call: one round trip per chunk, results in order.

        Every call is validated and encoded before anything is sent, so a bad
        one (an argument JSON cannot carry, an oversize payload) raises,
        naming its index, and no job of the batch is enqueued. Inside
        ``transaction.atomic()`` the batch waits for the commit (or goes
        through the outbox) exactly as a single ``enqueue`` does.
        """
        if tracing.enabled():
            with tracing.enqueue_span(task.queue_name, task.module_path, _count(calls)) as (span, carrier):
                results = self._enqueue_many(task, calls, _one, carrier)
                tracing.enqueued(span, [r.id for r in results[:1]])
                return results
        return self._enqueue_many(task, calls, _one, None)

    def _enqueue_many(self, task: Task, calls: Iterable[tuple[Any, Any]], _one: bool,
                      carrier: dict[str, str] | None) -> list[TaskResult]:
        with nullcontext() if _one else _gc_paused():
            queue, built, checked = self._build(task, calls, _one, carrier)
            if not built:
                return []
            if (self.outbox or self.enqueue_on_commit) and connection.in_atomic_block:
                results = self._ready_results(task, built, checked)
                self._defer(queue, task, built, results)
                return results
            # the TaskResults need nothing from Redis: they are made while it runs each chunk
            results = []
            queue.add_built_many(built, meanwhile=lambda chunk: results.extend(
                self._ready_results(task, chunk, checked[len(results):len(results) + len(chunk)])))
        self._sent(queue, task, results)
        return results

    def _defer(self, queue: Queue, task: Task, built: list, results: list[TaskResult]) -> None:
        """Inside ``transaction.atomic()``: stage the jobs in the outbox, or send them on commit."""
        if self.outbox:
            def committed(relayed: bool) -> None:
                # Not relayed: Redis is down, and a READY record would meet the same outage; the workers'
                # relay sends the jobs, and get_result() finds each once its worker records it.
                self._sent(queue, task, results, store=relayed)

            outbox.stage(queue.name, built, queue_for=self.outbox_queue, after_commit=committed)
            return

        def send() -> None:
            queue.add_built_many(built)
            self._sent(queue, task, results)

        transaction.on_commit(send)

    def _build(self, task: Task, calls: Iterable[tuple[Any, Any]], one: bool,
               carrier: dict[str, str] | None = None) -> tuple[Queue, list[BuiltJob], list[tuple[Any, Any]]]:
        """Validate and encode every call (validated now, even when sent later: bad input fails in the caller).

        Returns the task's queue, the encoded jobs and each call's checked ``(args, kwargs)``, in order.
        """
        plan = self._plan(task)
        queue, options, template = plan.queue, plan.options, plan.template
        if carrier is not None:
            options = _traced(options, carrier)
            template = queue.template(JobSpec(plan.task_path, **options))
        build = template.build
        built: list[BuiltJob] = []
        checked: list[tuple[Any, Any]] = []
        for index, call in enumerate(calls):
            args, kwargs = call if one else _unpack_call(index, call)
            try:
                built.append(build(args, kwargs))
            except (TypeError, ValueError) as exc:
                if one:
                    raise
                raise type(exc)(f"call {index}: {exc}") from exc
            checked.append((args, kwargs))
        if options["job_id"] is not None and len(built) > 1:
            raise ValueError("job_id names one job: use it with enqueue(), not with enqueue_many() of several calls")
        if isinstance(options.get("idempotency_key"), str) and len(built) > 1:
            raise ValueError("idempotency_key names the work of one job: with enqueue_many() of several calls, "
                             "use idempotency_key=True (each job guarded by its own id)")
        return queue, built, checked

    def _ready_results(self, task: Task, built: Sequence[BuiltJob],
                       checked: Sequence[tuple[Any, Any]]) -> list[TaskResult]:
        """The READY TaskResult of each job of ``built``, whose calls are ``checked``."""
        alias = self.alias
        return [ready_result(task, job.job_id, args, kwargs, alias)
                for job, (args, kwargs) in zip(built, checked, strict=True)]

    def _sent(self, queue: Queue, task: Task, results: list[TaskResult], *, store: bool | None = None) -> None:
        """Record the jobs as sent: their READY records (with RESULT_TTL), ``enqueued_at``, the signal.

        ``store`` is None when the caller just sent the jobs (a failure to
        record them raises, as the send would have); True or False after an
        outbox relay, whose jobs are safe whatever Redis does now: a READY
        record is then written only if the relay reached Redis, and a failure
        to write it is logged, never raised into the committing code.
        """
        if self.result_ttl and store is None:
            self._store_ready(queue, task, results)
        elif self.result_ttl and store:
            try:
                self._store_ready(queue, task, results)
            except RedisError as exc:
                logger.warning("READY record(s) of %d outbox job(s) not written (%s); get_result() finds them "
                               "once a worker runs them", len(results), exc)
        now = timezone.now()
        wanted = _enqueued.wanted(TaskResultStatus.READY)
        for result in results:
            object.__setattr__(result, "enqueued_at", now)
            if wanted:
                _enqueued.send(result)

    async def aenqueue(self, task: Task, args, kwargs) -> TaskResult:
        return (await self.aenqueue_many(task, [(args, kwargs)], _one=True))[0]

    async def aenqueue_many(self, task: Task, calls: Iterable[tuple[Any, Any]], *,
                            _one: bool = False) -> list[TaskResult]:
        """``enqueue_many`` from async code: the same checks, the same results."""
        if self.enqueue_on_commit or self.outbox or self.result_ttl:
            # these touch the database or the transaction: Django's sync side does it
            return await sync_to_async(self.enqueue_many, thread_sensitive=True)(task, list(calls), _one=_one)
        if tracing.enabled():
            calls = list(calls)
            with tracing.enqueue_span(task.queue_name, task.module_path, len(calls)) as (span, carrier):
                results = await self._aenqueue_many(task, calls, _one, carrier)
                tracing.enqueued(span, [r.id for r in results[:1]])
                return results
        return await self._aenqueue_many(task, calls, _one, None)

    async def _aenqueue_many(self, task: Task, calls: Iterable[tuple[Any, Any]], _one: bool,
                             carrier: dict[str, str] | None) -> list[TaskResult]:
        queue, built, checked = self._build(task, calls, _one, carrier)
        results = self._ready_results(task, built, checked)
        if built:
            await queue.aadd_built_many(built)
        now = timezone.now()
        wanted = _enqueued.wanted(TaskResultStatus.READY)
        for result in results:
            object.__setattr__(result, "enqueued_at", now)
            if wanted:
                await _enqueued.asend(result)
        return results

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
        errors = task_errors(data.get("errors", []))
        worker_ids = [e.get("worker", "") for e in data.get("errors", [])]
        if data.get("status") == "SUCCESSFUL":
            worker_ids.append(data.get("worker", ""))
        result = TaskResult(
            task=task, id=result_id, status=TaskResultStatus(data["status"]),
            enqueued_at=ms_to_datetime(data.get("enqueued_at")), started_at=ms_to_datetime(data.get("started_at")),
            finished_at=ms_to_datetime(data.get("finished_at")) if data["status"] in ("SUCCESSFUL", "FAILED") else None,
            last_attempted_at=ms_to_datetime(data.get("last_attempted_at")), args=data.get("args", []),
            kwargs=data.get("kwargs", {}), backend=self.alias, errors=errors, worker_ids=worker_ids,
        )
        object.__setattr__(result, "_return_value", data.get("return_value"))
        return result

    def progress(self, result_id: str) -> Progress | None:
        """The latest progress the job reported (a task that takes its context calls
        ``context.report_progress``), or None. Django's TaskResult has no room for it, so it is read here:
        ``task_backends["default"].progress(result.id)``. Kept a day after the last report."""
        pipe = self.client.pipeline(transaction=False)
        for name in sorted(self.queues):
            pipe.get(QueueKeys.for_queue(name).progress + result_id)
        for blob in pipe.execute():
            found = decode_progress(blob)
            if found is not None:
                return found
        return None

    # --- the worker side ------------------------------------------------------------------

    def check(self, **kwargs):
        try:
            chasqui_settings()
        except ImproperlyConfigured as exc:
            from django.core.checks import Error

            return [Error(str(exc), id="chasqui.E001")]
        return []


_enqueued = TaskSignal(task_enqueued, ChasquiBackend)
