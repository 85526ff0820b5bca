"""Django Tasks as engine handlers: what runs around each job in a worker.

A worker runs only the project's Django Tasks (``build_registry``), each
wrapped to give Django what it expects around a run: a ``TaskContext`` when
the task asks for one, the ``task_started`` / ``task_finished`` signals, and
database connections checked like a request's.

Per job this costs microseconds: the TaskResult is built only when a context
or a receiver needs it (``TaskSignal.wanted``), signals that only Django's
logging hears are sent inline, and connection hygiene runs only in a thread
that has a connection open.

Signals follow Django's meaning. ``task_started`` goes out for every run.
``task_finished`` means the job is finished: it goes out once, when the job
succeeded or failed for good (budget spent, or unrecoverable), with
``finished_at`` set and, for a failure, the job's errors in ``errors``. A run
that fails and will be retried sends no ``task_finished``: the job is back to
READY, its errors visible through ``get_result()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from inspect import iscoroutinefunction
from typing import Any

from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created
from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started

from chasqui_core.backend import ChasquiBackend
from chasqui_core.engine.jobs.errors import JobCancelled
from chasqui_core.engine.jobs.registry import HandlerRegistry, JobContext
from chasqui_core.engine.jobs.tracebacks import class_path, format_exception
from chasqui_core.task import ChasquiTask, discover_tasks
from chasqui_core.task_results import ms_to_datetime, task_errors, task_result
from chasqui_core import tracing
from chasqui_core.task_signals import TaskSignal

_started = TaskSignal(task_started, ChasquiBackend)
_finished = TaskSignal(task_finished, ChasquiBackend)

RUNNING, SUCCESSFUL, FAILED = TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def build_registry() -> HandlerRegistry:
    """The handlers a worker may run: the project's Django Tasks, nothing else."""
    registry = HandlerRegistry()
    for name, task in discover_tasks().items():
        registry.register(name, task_handler(task), takes_context=True, max_attempts=task.max_attempts,
                          backoff=task.backoff, is_async=iscoroutinefunction(task.func), timeout=task.timeout)
    return registry


def task_handler(task: ChasquiTask):
    """Wrap one Django Task for the engine (async tasks stay async, sync ones run in the worker's threads)."""
    func = task.func
    takes_context = task.takes_context

    if iscoroutinefunction(func):
        def run_async(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
            """The coroutine the worker awaits: watched for failures only, unless a receiver wants more."""
            if tracing.enabled_for_run(ctx.job.meta):
                return traced(ctx, args, kwargs)
            return untraced(ctx, args, kwargs)

        def untraced(ctx: JobContext, args: Any, kwargs: Any) -> Any:
            started = _started.wanted(RUNNING)
            if takes_context or started or _finished.wanted(SUCCESSFUL):
                return observed(ctx, started, args, kwargs)
            return guarded(ctx, args, kwargs)

        async def traced(ctx: JobContext, args: Any, kwargs: Any) -> Any:
            with _run_span(task, ctx) as span:
                try:
                    value = await untraced(ctx, args, kwargs)
                except BaseException as exc:
                    tracing.ended(span, _outcome(ctx, exc), exc)
                    raise
                tracing.ended(span, "succeeded")
                return value

        async def guarded(ctx: JobContext, args: Any, kwargs: Any) -> Any:
            """The common case: nothing to send unless the run fails for good."""
            try:
                return await func(*args, **kwargs)
            except Exception as exc:
                if not ctx.will_retry(exc) and _finished.wanted(FAILED):
                    await _finished.asend(finished_result(task, ctx, None, exc))
                raise
            except asyncio.CancelledError:  # cancelled by a cancel request: the job is finished
                if ctx.cancelled and _finished.wanted(FAILED):
                    await _finished.asend(finished_result(task, ctx, None, JobCancelled()))
                raise

        async def observed(ctx: JobContext, started: bool, args: Any, kwargs: Any) -> Any:
            result = context = None
            if started:
                result = running_result(task, ctx)
                await _started.asend(result)
            try:
                if takes_context:
                    context = RunContext(task, ctx, result)
                    value = await func(context, *args, **kwargs)
                else:
                    value = await func(*args, **kwargs)
            except Exception as exc:
                ctx.run_returned()  # before the signal's receivers (logging): the run itself has ended
                if not ctx.will_retry(exc) and _finished.wanted(FAILED):
                    await _finished.asend(finished_result(task, ctx, shown(context, result), exc))
                raise
            except asyncio.CancelledError:
                if ctx.cancelled and _finished.wanted(FAILED):
                    await _finished.asend(finished_result(task, ctx, shown(context, result), JobCancelled()))
                raise
            ctx.run_returned()
            if _finished.wanted(SUCCESSFUL):
                await _finished.asend(finished_result(task, ctx, shown(context, result)))
            return value

        return run_async

    def run_sync(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
        if not tracing.enabled_for_run(ctx.job.meta):
            return run_untraced(ctx, args, kwargs)
        with _run_span(task, ctx) as span:
            try:
                value = run_untraced(ctx, args, kwargs)
            except BaseException as exc:
                tracing.ended(span, _outcome(ctx, exc), exc)
                raise
            tracing.ended(span, "succeeded")
            return value

    def run_untraced(ctx: JobContext, args: Any, kwargs: Any) -> Any:
        if _thread.connected:  # check_connections, looked at here first: a job's every run asks twice
            check_connections()
        try:
            result = context = None
            if _started.wanted(RUNNING):
                result = running_result(task, ctx)
                _started.send(result)
            try:
                if takes_context:
                    context = RunContext(task, ctx, result)
                    value = func(context, *args, **kwargs)
                else:
                    value = func(*args, **kwargs)
            except Exception as exc:
                ctx.run_returned()  # before the signal's receivers (logging): the run itself has ended
                if not ctx.will_retry(exc) and _finished.wanted(FAILED):
                    _finished.send(finished_result(task, ctx, shown(context, result), exc))
                raise
            ctx.run_returned()
            if _finished.wanted(SUCCESSFUL):
                _finished.send(finished_result(task, ctx, shown(context, result)))
            return value
        finally:
            if _thread.connected:
                check_connections()

    return run_sync


def _run_span(task: ChasquiTask, ctx: JobContext):
    """The run's span, a child of the enqueue that the job's meta names (see chasqui_core/tracing.py)."""
    job = ctx.job
    return tracing.run_span(ctx.queue, task.module_path, job.id, job.attempt + 1, job.meta)


def _outcome(ctx: JobContext, exc: BaseException) -> str:
    """How a run that raised ``exc`` ends, in a span's words: cancelled, retrying, or failed for good."""
    if isinstance(exc, (JobCancelled, asyncio.CancelledError)) or ctx.cancelled:
        return "cancelled"
    return "retrying" if isinstance(exc, Exception) and ctx.will_retry(exc) else "failed"


# --- the TaskResult a run shows ------------------------------------------------------


class RunContext(TaskContext):
    """The ``TaskContext`` a task that takes one is given: its TaskResult is built when first read.

    Most such tasks only look at ``context.attempt``. Building the TaskResult
    (timestamps, the error history as TaskErrors, the worker ids) on every
    run cost more than the rest of running the task; now it is built only
    for a task that reads ``context.task_result``, as of the run's start.
    """

    __slots__ = ("_task", "_run", "_started", "built")

    def __init__(self, task: ChasquiTask, run: JobContext, result: TaskResult | None = None) -> None:
        # Built on every run of such a task: each slot's own setter, as task_results.task_result does, because
        # TaskContext is a frozen dataclass and object.__setattr__ looks every name up (a microsecond a run).
        _set_task(self, task)
        _set_run(self, run)
        _set_started(self, time.time())
        _set_built(self, result)

    @property  # type: ignore[override]
    def task_result(self) -> TaskResult:
        result: TaskResult | None = self.built
        if result is None:
            result = running_result(self._task, self._run, datetime.fromtimestamp(self._started, UTC))
            _set_built(self, result)
        return result

    @property
    def attempt(self) -> int:
        """This run's number, counting the runs before it (``task_result.attempts`` without building it)."""
        return len(self._run.job.errors) + self._run.deliveries

    @property
    def cancelled(self) -> bool:
        """Whether someone cancelled this job while it runs. An async task is cancelled for it anyway; a sync
        one should check between steps (``check_cancelled``), or it is given up after the worker's grace."""
        return self._run.cancelled

    def check_cancelled(self) -> None:
        """Raise ``JobCancelled`` if this job was cancelled: the run ends as cancelled, and is not retried."""
        self._run.check_cancelled()

    def report_progress(self, value: float, message: str = "") -> None:
        """Say how far this run has got: a number (a percentage, or items done) and a short message, shown on
        the job's page, in the API and by ``chasqui_core.backend.progress_of``. Cheap: written at most twice
        a second, the latest report winning."""
        self._run.report_progress(value, message)


_set_task, _set_run, _set_started, _set_built = (RunContext.__dict__[name].__set__ for name in RunContext.__slots__)


def running_result(task: ChasquiTask, ctx: JobContext, now: datetime | None = None) -> TaskResult:
    """The job as Django sees it while this run goes on (its arguments come decoded, in JSON form)."""
    if now is None:
        now = datetime.now(UTC)
    job = ctx.job
    return task_result(
        task, job.id, RUNNING, job.args, job.kwargs, job.meta.get("backend", "default"),
        enqueued_at=ms_to_datetime(job.created_at), started_at=now, last_attempted_at=now,
        errors=task_errors(job.errors),
        # one id per run so far, this one included: TaskContext.attempt counts them
        worker_ids=[e.get("worker", "") for e in job.errors] + [""] * (ctx.deliveries - 1) + [ctx.worker_id],
    )


def shown(context: RunContext | None, result: TaskResult | None) -> TaskResult | None:
    """The TaskResult this run has shown so far, for ``task_finished`` to carry on from (None: none yet).

    The context's, when the task read it; otherwise the one ``task_started`` carried.
    """
    return context.built if context is not None else result


def finished_result(task: ChasquiTask, ctx: JobContext, result: TaskResult | None,
                    exc: BaseException | None = None) -> TaskResult:
    """The result ``task_finished`` carries: the running one, now SUCCESSFUL or FAILED for good."""
    if result is None:
        result = running_result(task, ctx)
    object.__setattr__(result, "finished_at", datetime.now(UTC))
    if exc is None:
        object.__setattr__(result, "status", SUCCESSFUL)
    else:
        object.__setattr__(result, "status", FAILED)
        try:
            text = format_exception(exc)
        except Exception as failure:  # an exception whose str() raises, say: keep the job's own error
            text = f"{class_path(exc)} (its traceback could not be formatted: {class_path(failure)})"
        result.errors.append(TaskError(exception_class_path=class_path(exc), traceback=text))
    return result


# --- database connections ----------------------------------------------------------------

class _ThreadState(threading.local):
    connected = False
    """Whether this thread opened a database connection since it last looked.

    A class default rather than ``getattr(local, name, False)``: a thread that
    never set it reads the default without raising and catching an
    AttributeError, a microsecond per job on every sync job of every worker.
    """


_thread = _ThreadState()


def _connected(sender: Any, connection: Any, **kwargs: Any) -> None:
    _thread.connected = True


connection_created.connect(_connected, dispatch_uid="chasqui-task-runner")


def check_connections() -> None:
    """Before and after each job, drop connections that are broken or past CONN_MAX_AGE.

    What Django does around each request. A thread that opened no connection
    since it last looked (the common case for jobs that do not touch the
    database) skips the walk over every database alias.
    """
    if _thread.connected:
        close_old_connections()
        _thread.connected = any(c.connection is not None for c in connections.all(initialized_only=True))
