"""Everything an operator can see and do, in one place for the API, the CLI
and the console.

Each function takes the acting user and, for changes, where the change came
from (``source``: "api", "console" or "cli"). It checks the user's permission
(``PermissionDenied``), validates the input in words a person understands
(``InvalidInput``), refuses unknown queues and jobs (``NotFound``) and
conflicting requests (``Conflict``), does the work through the engine, and
records every change in the audit log with the number of entries it touched.
Callers only translate those four exceptions into their own idiom: an HTTP
status, a CLI error, a flash message.

``actor=None`` is the shell: a ``manage.py`` user already holds the keys to
the database and Redis, so the CLI runs unchecked when no ``--as`` user is
given (and is still audited, as "cli").
"""

from __future__ import annotations

import inspect as pyinspect
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any, Literal

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.tasks import TaskResult, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils import timezone
from redis.exceptions import ResponseError

from chasqui_core import access
from chasqui_core.backend import ChasquiBackend, ChasquiTask, discover_tasks
from chasqui_core.engine import delayed as delayed_mod
from chasqui_core.engine import stats
from chasqui_core.engine import metrics as metrics_mod
from chasqui_core.engine.dlq.browse import ErrorGroup, Page
from chasqui_core.engine.dlq.entries import DeadJob
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.errors import InvalidQueueName, JobNotFound
from chasqui_core.engine.keys import validate_queue_name
from chasqui_core.models import KEY_PREFIX_LENGTH, ApiKey, AuditEntry, Operation, hash_key

Source = Literal["api", "console", "cli"]
SOURCES = ("api", "console", "cli")

MAX_PAGE = 500
"""Largest page any listing returns."""

API_KEY_TOUCH_INTERVAL = timedelta(minutes=1)


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


def background_threshold() -> int:
    """Filtered replays/discards matching more entries than this run in the background."""
    from chasqui_core.conf import chasqui_settings

    return chasqui_settings().BACKGROUND_THRESHOLD


def require(actor, codename: str, source: str = "api") -> None:
    """Raise PermissionDenied unless ``actor`` holds ``chasqui_core.<codename>``."""
    if actor is None and source == "cli":
        return
    if not access.has(actor, codename):
        raise PermissionDenied(
            f"Permission denied: this needs the '{access.full_name(codename)}' permission "
            f"({access.PERMISSIONS[codename]})."
        )


def _check_source(source: str) -> None:
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


def _page_limit(limit: Any, maximum: int = MAX_PAGE) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise InvalidInput(f"limit must be a whole number from 1 to {maximum}, got {limit!r}")
    return limit


def _ms(value: datetime | int | None, name: str) -> int | None:
    """Epoch milliseconds from an aware datetime (naive means UTC) or an int of ms."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt_timezone.utc)
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


# --- queues -------------------------------------------------------------------------


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


def queue_overview(actor, *, source: Source = "api") -> list[stats.QueueStats]:
    """Live stats of every known queue, in one round trip."""
    require(actor, access.VIEW, source)
    return stats.all_queue_stats(redis_client(), known_queues())


def queue_detail(actor, queue: str, *, source: Source = "api") -> stats.QueueStats:
    require(actor, access.VIEW, source)
    return stats.queue_stats(redis_client(), require_queue(queue))


def queue_metrics(
    actor, queue: str, *, resolution: str = "second", window: int | None = None, source: Source = "api"
) -> metrics_mod.Series:
    """Counters per second (default: the last hour) or per minute (default: the last day)."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return metrics_mod.series(redis_client(), queue, resolution=resolution, window=window)


def worker_list(
    actor, *, queue: str | None = None, stale_after_ms: int = stats.DEFAULT_STALE_AFTER_MS,
    source: Source = "api",
) -> list[stats.WorkerInfo]:
    """Workers known from their heartbeats; ``stale`` marks the ones that stopped beating."""
    require(actor, access.VIEW, source)
    if queue is not None:
        queue = require_queue(queue)
    if isinstance(stale_after_ms, bool) or not isinstance(stale_after_ms, int) or stale_after_ms < 1:
        raise InvalidInput(f"stale_after_ms must be a whole number of 1 or more, got {stale_after_ms!r}")
    return stats.workers(redis_client(), queue, stale_after_ms=stale_after_ms)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    name: str
    queue: str
    max_attempts: int | None
    parameters: list[str]


def task_list(actor, *, source: Source = "api") -> list[TaskInfo]:
    """The project's tasks, the only ones that can be enqueued by name."""
    require(actor, access.VIEW, source)
    out = []
    for name, task in sorted(discover_tasks().items()):
        params = list(pyinspect.signature(task.func).parameters)
        if task.takes_context and params:
            params = params[1:]
        out.append(TaskInfo(name, task.queue_name, task.max_attempts, params))
    return out


# --- the dead-letter queue -----------------------------------------------------------


def build_filter(
    *,
    task: str | None = None,
    reason: str | None = None,
    error_class: str | None = None,
    error_text: str | None = None,
    fingerprint: str | None = None,
    since: datetime | int | None = None,
    until: datetime | int | None = None,
) -> DLQFilter:
    """A DLQFilter from what a person typed; times are datetimes (naive = UTC) or epoch ms.

    ``fingerprint`` is one error group exactly as ``dlq_groups`` (or an entry's
    ``fingerprint``) gives it: acting on a group is an ordinary filtered operation.
    """
    since_ms, until_ms = _ms(since, "since"), _ms(until, "until")
    with engine_errors:
        return DLQFilter(task=task, reason=reason, error_class=error_class, error_text=error_text,
                         fingerprint=fingerprint, since_ms=since_ms, until_ms=until_ms)


def coerce_filter(value: DLQFilter | Mapping[str, Any] | None) -> DLQFilter:
    """A DLQFilter from a filter, its ``to_dict()`` form (``fingerprint`` included), or None (everything)."""
    if value is None:
        return DLQFilter()
    if isinstance(value, DLQFilter):
        return value
    with engine_errors:
        return DLQFilter.from_dict(value)


def _dead_letters(queue: str) -> DeadLetters:
    return DeadLetters(redis_client(), queue)


def dlq_page(
    actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None, cursor: str | None = None,
    limit: int = 50, source: Source = "api",
) -> Page:
    """Dead jobs newest first; pass ``next_cursor`` back for the next (older) page."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    limit = _page_limit(limit)
    f = coerce_filter(filter)
    with engine_errors:
        return _dead_letters(queue).page(cursor=cursor or None, limit=limit, filter=f)


def dlq_entry(actor, queue: str, entry_id: str, *, source: Source = "api") -> DeadJob:
    """One dead job with its whole error history."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return _dead_letters(queue).get(entry_id)


def dlq_groups(
    actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None, source: Source = "api"
) -> list[ErrorGroup]:
    """Dead jobs grouped by error fingerprint (class + normalised message), biggest group first."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    f = coerce_filter(filter)
    with engine_errors:
        return _dead_letters(queue).groups(f)


def dlq_count(actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None,
              source: Source = "api") -> int:
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    f = coerce_filter(filter)
    with engine_errors:
        return _dead_letters(queue).count_matching(f)


# --- the delayed set --------------------------------------------------------------------


def delayed_page(
    actor, queue: str, *, cursor: str | None = None, limit: int = 50, source: Source = "api"
) -> delayed_mod.DelayedPage:
    """Delayed jobs (scheduled runs and retries waiting), soonest first."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    limit = _page_limit(limit)
    with engine_errors:
        return delayed_mod.page(redis_client(), queue, cursor=cursor or None, limit=limit)


def delayed_job(actor, queue: str, job_id: str, *, source: Source = "api") -> delayed_mod.DelayedJob:
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        job = delayed_mod.find(redis_client(), queue, job_id)
    if job is None:
        raise NotFound(_no_delayed(queue, job_id))
    return job


def _no_delayed(queue: str, job_id: str) -> str:
    return (f"No delayed job {job_id!r} in queue {queue!r}: it already ran, was cancelled, "
            f"or the id is wrong")


# --- jobs ---------------------------------------------------------------------------------


def job_result(actor, job_id: str, *, source: Source = "api") -> TaskResult:
    """A job's status and result, when result storage is on (``TASKS[...]['OPTIONS']['RESULT_TTL']``)."""
    require(actor, access.VIEW, source)
    be = backend()
    if not be.supports_get_result:
        raise NotFound(
            "Result storage is off, so job results are not kept: set "
            "TASKS['default']['OPTIONS']['RESULT_TTL'] to a number of seconds to keep them"
        )
    if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
        raise InvalidInput("job_id must be a non-empty string of at most 200 characters")
    try:
        with engine_errors:
            return be.get_result(job_id)
    except TaskResultDoesNotExist:
        raise NotFound(f"No result for job {job_id!r}: it does not exist, or its result expired") from None


def enqueue(
    actor,
    queue: str | None,
    task_name: str,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    delay_ms: int | None = None,
    attempts: int | None = None,
    backoff: Any = None,
    job_id: str | None = None,
    source: Source,
) -> TaskResult:
    """Enqueue a registered task of the project by name (queue None: the task's own queue)."""
    _check_source(source)
    require(actor, access.ENQUEUE, source)
    tasks = discover_tasks()
    task = tasks.get(task_name) if isinstance(task_name, str) else None
    if task is None:
        known = ", ".join(sorted(tasks)) or "none"
        raise InvalidInput(f"Unknown task {task_name!r}: only the project's tasks can be enqueued ({known})")
    queue = task.queue_name if queue is None else require_queue(queue)
    be = backend()
    if queue not in be.queues:
        raise InvalidInput(
            f"Queue {queue!r} is not served by the task backend: tasks can be enqueued on "
            f"{', '.join(sorted(be.queues))} (TASKS['default']['QUEUES'])"
        )
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
        raise InvalidInput("args must be a list")
    args = list(args)
    kwargs = dict(kwargs or {})
    if not all(isinstance(k, str) for k in kwargs):
        raise InvalidInput("kwargs keys must be strings")
    _check_signature(task, task_name, args, kwargs)
    if delay_ms is not None and (isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0):
        raise InvalidInput(f"delay_ms must be a whole number of milliseconds, 0 or more, got {delay_ms!r}")
    with engine_errors:
        run_after = timezone.now() + timedelta(milliseconds=delay_ms) if delay_ms else None
        configured: ChasquiTask = task.using(queue_name=queue, run_after=run_after, attempts=attempts,
                                             backoff=backoff, job_id=job_id)
        result = configured.enqueue(*args, **kwargs)
    detail = {"task": task_name, "delay_ms": delay_ms, "attempts": attempts, "job_id_given": job_id is not None}
    record(actor, AuditEntry.Action.ENQUEUE, source=source, queue=queue, target_ids=[result.id], count=1,
           detail=detail)
    return result


def _check_signature(task: ChasquiTask, name: str, args: list, kwargs: dict) -> None:
    """Refuse arguments the task's function cannot take, before the job fails in a worker."""
    try:
        signature = pyinspect.signature(task.func)
    except (TypeError, ValueError):
        return
    params = list(signature.parameters.values())
    if task.takes_context and params:
        signature = signature.replace(parameters=params[1:])
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidInput(f"Arguments do not fit task {name!r}{signature}: {exc}") from None


def pause(actor, queue: str, *, source: Source) -> bool:
    """Stop workers reading the queue (nothing is lost); False when it was paused already."""
    return _switch(actor, queue, source, AuditEntry.Action.PAUSE, stats.pause)


def resume(actor, queue: str, *, source: Source) -> bool:
    """Let workers read the queue again; False when it was not paused."""
    return _switch(actor, queue, source, AuditEntry.Action.RESUME, stats.resume)


def _switch(actor, queue: str, source: str, action: str, flip: Callable[[Any, str], bool]) -> bool:
    _check_source(source)
    require(actor, access.PAUSE, source)
    queue = require_queue(queue)
    changed = flip(redis_client(), queue)
    record(actor, action, source=source, queue=queue, count=1 if changed else 0, detail={"changed": changed})
    return changed


def cancel_delayed(actor, queue: str, job_id: str, *, source: Source) -> None:
    """Remove one delayed job for good; NotFound when it is no longer delayed."""
    _check_source(source)
    require(actor, access.DISCARD, source)
    queue = require_queue(queue)
    with engine_errors:
        cancelled = delayed_mod.cancel(redis_client(), queue, job_id)
    if not cancelled:
        raise NotFound(_no_delayed(queue, job_id))
    record(actor, AuditEntry.Action.CANCEL_DELAYED, source=source, queue=queue, target_ids=[job_id], count=1)


def run_delayed_now(actor, queue: str, job_id: str, *, source: Source) -> str:
    """Move one delayed job to the stream at once; returns its new stream entry id."""
    _check_source(source)
    require(actor, access.ENQUEUE, source)
    queue = require_queue(queue)
    with engine_errors:
        entry_id = delayed_mod.run_now(redis_client(), queue, job_id)
    if entry_id is None:
        raise NotFound(_no_delayed(queue, job_id))
    record(actor, AuditEntry.Action.RUN_DELAYED_NOW, source=source, queue=queue, target_ids=[job_id], count=1,
           detail={"entry_id": entry_id})
    return entry_id


# --- replay and discard -------------------------------------------------------------------------

Progress = Callable[[int, int], None]
ShouldStop = Callable[[], bool]


def replay(
    actor,
    queue: str,
    *,
    ids: Iterable[str] | None = None,
    filter: DLQFilter | Mapping[str, Any] | None = None,
    reset_attempts: bool = True,
    run_at: datetime | int | None = None,
    source: Source,
    background: bool | None = None,
    progress: Progress | None = None,
    should_stop: ShouldStop | None = None,
) -> int | Operation:
    """Send dead jobs back to work, by entry ids or by filter (exactly one of them).

    ``reset_attempts`` gives each job its whole retry budget again; False
    grants exactly one more run. ``run_at`` schedules them instead of running
    them now. Returns how many entries were replayed, or, for a filter that
    matches more than ``background_threshold()`` entries, the started
    background Operation (``background=True``/``False`` forces either way).
    ``progress(done, total)`` and ``should_stop()`` apply when run inline;
    stopping leaves every entry either replayed or untouched.
    """
    _check_source(source)
    require(actor, access.REPLAY, source)
    if not isinstance(reset_attempts, bool):
        raise InvalidInput("reset_attempts must be true or false")
    options = {"reset_attempts": reset_attempts, "run_at_ms": _ms(run_at, "run_at")}
    return _bulk(actor, Operation.Kind.REPLAY, queue, ids, filter, options, source, background, progress,
                 should_stop)


def discard(
    actor,
    queue: str,
    *,
    ids: Iterable[str] | None = None,
    filter: DLQFilter | Mapping[str, Any] | None = None,
    source: Source,
    background: bool | None = None,
    progress: Progress | None = None,
    should_stop: ShouldStop | None = None,
) -> int | Operation:
    """Delete dead jobs for good, by entry ids or by filter; see ``replay`` for the rest."""
    _check_source(source)
    require(actor, access.DISCARD, source)
    return _bulk(actor, Operation.Kind.DISCARD, queue, ids, filter, {}, source, background, progress, should_stop)


def _bulk(actor, kind: str, queue: str, ids, filter, options: dict, source: str, background: bool | None,
          progress: Progress | None, should_stop: ShouldStop | None) -> int | Operation:
    queue = require_queue(queue)
    if (ids is None) == (filter is None):
        raise InvalidInput("Give either a list of entry ids or a filter (an empty filter matches every entry)")
    dl = _dead_letters(queue)
    action = AuditEntry.Action.REPLAY if kind == Operation.Kind.REPLAY else AuditEntry.Action.DISCARD
    if ids is not None:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise InvalidInput("ids must be a list of dead-letter entry ids")
        ids = list(ids)
        if not ids:
            raise InvalidInput("ids is empty: give at least one dead-letter entry id")
        with engine_errors:
            if kind == Operation.Kind.REPLAY:
                count = dl.replay(ids, reset_attempts=options["reset_attempts"], run_at_ms=options["run_at_ms"])
            else:
                count = dl.discard(ids)
        record(actor, action, source=source, queue=queue, target_ids=ids, count=count,
               detail={**options, "requested": len(ids)})
        return count

    f = coerce_filter(filter)
    matching = None
    if background is None:
        with engine_errors:
            matching = dl.count_matching(f)
        background = matching > background_threshold()
    if background:
        from chasqui_core import operations

        return operations.launch(actor, kind, queue, f, options, source, total=matching or 0)

    tracker = _Tracker(progress, should_stop)
    with engine_errors:
        if kind == Operation.Kind.REPLAY:
            count = dl.replay_matching(f, reset_attempts=options["reset_attempts"], run_at_ms=options["run_at_ms"],
                                       progress=tracker.progress, should_stop=tracker.should_stop)
        else:
            count = dl.discard_matching(f, progress=tracker.progress, should_stop=tracker.should_stop)
    detail = {**options, "done": tracker.done, "total": tracker.total}
    if tracker.stopped:
        detail["interrupted"] = True
    record(actor, action, source=source, queue=queue, filter=f.to_dict(), count=count, detail=detail)
    return count


class _Tracker:
    """Remembers the last progress figures and whether a stop was asked, for the audit entry."""

    def __init__(self, progress: Progress | None, should_stop: ShouldStop | None) -> None:
        self._progress = progress
        self._should_stop = should_stop
        self.done = 0
        self.total = 0
        self.stopped = False

    def progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self._progress is not None:
            self._progress(done, total)

    def should_stop(self) -> bool:
        if self._should_stop is not None and self._should_stop():
            self.stopped = True
        return self.stopped


# --- background operations ---------------------------------------------------------------------


def _operation(op_id: Any) -> Operation:
    try:
        pk = op_id if isinstance(op_id, uuid.UUID) else uuid.UUID(str(op_id))
        return Operation.objects.get(pk=pk)
    except (Operation.DoesNotExist, ValueError):
        raise NotFound(f"No operation {op_id!s}") from None


def get_operation(actor, op_id: Any, *, source: Source = "api") -> Operation:
    from chasqui_core import operations

    require(actor, access.VIEW, source)
    operations.reap_stale()
    return _operation(op_id)


def list_operations(
    actor, *, queue: str | None = None, status: str | None = None, limit: int = 50, source: Source = "api"
) -> list[Operation]:
    """Background operations, newest first."""
    from chasqui_core import operations

    require(actor, access.VIEW, source)
    limit = _page_limit(limit)
    operations.reap_stale()
    qs = Operation.objects.all()
    if queue:
        qs = qs.filter(queue=queue)
    if status:
        if status not in Operation.Status.values:
            raise InvalidInput(f"Unknown status {status!r}: use one of {', '.join(Operation.Status.values)}")
        qs = qs.filter(status=status)
    return list(qs.select_related("created_by")[:limit])


def cancel_operation(actor, op_id: Any, *, source: Source) -> Operation:
    """Ask a background operation to stop after its current chunk (what is done stays done)."""
    _check_source(source)
    op = _operation(op_id)
    require(actor, access.REPLAY if op.kind == Operation.Kind.REPLAY else access.DISCARD, source)
    from chasqui_core import operations

    with transaction.atomic():
        updated = Operation.objects.filter(pk=op.pk).exclude(status__in=Operation.FINISHED).update(
            cancel_requested=True)
    op.refresh_from_db()
    if not updated:
        raise Conflict(f"Operation {op.pk} has already finished ({op.status}): there is nothing to cancel")
    operations.request_cancel(op.pk)
    record(actor, AuditEntry.Action.CANCEL_OPERATION, source=source, queue=op.queue, target_ids=[str(op.pk)],
           filter=op.filter, count=0, detail={"kind": op.kind, "done": op.done, "total": op.total})
    return op


# --- the audit log -----------------------------------------------------------------------------


def actor_label(actor) -> str:
    if actor is None:
        return "cli"
    name = actor.get_username() if hasattr(actor, "get_username") else str(actor)
    key = getattr(actor, "chasqui_api_key", None)
    return f"{name} (API key {key})" if key else name


def record(
    actor,
    action: str,
    *,
    source: str,
    queue: str = "",
    target_ids: Iterable[Any] = (),
    filter: Mapping[str, Any] | None = None,
    count: int = 0,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Write one audit entry. ``actor`` may carry ``chasqui_api_key`` (the key's prefix) when it came by key."""
    _check_source(source)
    ids = [str(i) for i in list(target_ids)[:AuditEntry.MAX_TARGET_IDS]]
    extra = dict(detail or {})
    key = getattr(actor, "chasqui_api_key", None)
    if key:
        extra["key_prefix"] = key
    return AuditEntry.objects.create(
        actor=actor if actor is not None and getattr(actor, "pk", None) else None,
        actor_repr=actor_label(actor)[:200],
        action=action,
        queue=queue,
        source=source,
        target_ids=ids,
        filter=dict(filter or {}),
        count=count,
        detail=extra,
    )


@dataclass(frozen=True, slots=True)
class AuditPage:
    items: list[AuditEntry]
    next_cursor: str | None


def audit_log(
    actor,
    *,
    action: str | None = None,
    queue: str | None = None,
    actor_name: str | None = None,
    source_filter: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
    source: Source = "api",
) -> AuditPage:
    """Audit entries newest first, filtered; ``next_cursor`` continues with older ones."""
    require(actor, access.VIEW, source)
    limit = _page_limit(limit)
    qs = AuditEntry.objects.order_by("-id")
    if action:
        if action not in AuditEntry.Action.values:
            raise InvalidInput(f"Unknown action {action!r}: use one of {', '.join(AuditEntry.Action.values)}")
        qs = qs.filter(action=action)
    if source_filter:
        if source_filter not in SOURCES:
            raise InvalidInput(f"Unknown source {source_filter!r}: use one of {', '.join(SOURCES)}")
        qs = qs.filter(source=source_filter)
    if queue:
        qs = qs.filter(queue=_clean_text(queue, "queue"))
    if actor_name:
        qs = qs.filter(actor_repr__startswith=_clean_text(actor_name, "actor"))
    if since is not None:
        qs = qs.filter(at__gte=_aware(since))
    if until is not None:
        qs = qs.filter(at__lt=_aware(until))
    if cursor:
        if not cursor.isdigit() or len(cursor) > 18:
            raise InvalidInput(f"cursor {cursor!r} is not one returned by a previous page; start without a cursor")
        qs = qs.filter(id__lt=int(cursor))
    rows = list(qs.select_related("actor")[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(rows, str(rows[-1].id) if more and rows else None)


def _clean_text(value: str, name: str) -> str:
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters")
    return value


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=dt_timezone.utc) if value.tzinfo is None else value


# --- API keys ------------------------------------------------------------------------------------


def create_api_key(actor, username: str, *, name: str = "", source: Source) -> tuple[ApiKey, str]:
    """Issue a key for user ``username``; returns the row and the key (shown once, stored as a hash)."""
    _check_source(source)
    _require_key_admin(actor, source)
    User = get_user_model()
    try:
        user = User.objects.get(**{User.USERNAME_FIELD: username})
    except User.DoesNotExist:
        raise NotFound(f"No user named {username!r}") from None
    if not user.is_active:
        raise InvalidInput(f"User {username!r} is inactive: an API key would not work")
    row, key = ApiKey.issue(user, name=name)
    record(actor, AuditEntry.Action.APIKEY_CREATE, source=source, target_ids=[row.prefix], count=1,
           detail={"user": user.get_username(), "name": name})
    return row, key


def revoke_api_key(actor, prefix: str, *, source: Source) -> ApiKey:
    """Revoke the active key starting with ``prefix`` (its shown prefix, or the whole key)."""
    _check_source(source)
    _require_key_admin(actor, source)
    prefix = (prefix or "").strip()
    if not prefix:
        raise InvalidInput("Give the key's prefix (as shown when it was created or in the admin)")
    active = ApiKey.objects.filter(revoked_at__isnull=True)
    if len(prefix) > KEY_PREFIX_LENGTH:  # the whole key was given
        matches = list(active.filter(key_hash=hash_key(prefix)))
    else:
        matches = list(active.filter(prefix__startswith=prefix))
    if not matches:
        raise NotFound(f"No active API key starts with {prefix!r}")
    if len(matches) > 1:
        raise InvalidInput(f"{len(matches)} active keys start with {prefix!r}: give more characters")
    row = matches[0]
    row.revoked_at = timezone.now()
    row.save(update_fields=["revoked_at"])
    record(actor, AuditEntry.Action.APIKEY_REVOKE, source=source, target_ids=[row.prefix], count=1,
           detail={"user": row.user.get_username(), "name": row.name})
    return row


def _require_key_admin(actor, source: str) -> None:
    if actor is None and source == "cli":
        return
    if actor is None or not getattr(actor, "is_superuser", False):
        raise PermissionDenied("Permission denied: only superusers can create or revoke API keys")


def authenticate_api_key(key: str):
    """The active user a bearer key belongs to, or None (unknown, revoked, or user inactive).

    ``last_used_at`` is written at most once a minute per key, so a busy
    script does not turn every read into a database write.
    """
    if not isinstance(key, str) or not key or len(key) > 200:
        return None
    try:
        row = ApiKey.objects.select_related("user").get(key_hash=hash_key(key), revoked_at__isnull=True)
    except ApiKey.DoesNotExist:
        return None
    user = row.user
    if not user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= API_KEY_TOUCH_INTERVAL:
        ApiKey.objects.filter(pk=row.pk).update(last_used_at=now)
    user.chasqui_api_key = row.prefix
    return user
