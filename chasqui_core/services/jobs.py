"""Jobs by name: the project's tasks, enqueueing one by hand, finding a job in any state, its stored result,
cancelling one."""

from __future__ import annotations

import inspect as pyinspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.tasks import TaskResult
from django.utils import timezone

from chasqui_core import access
from chasqui_core.task import ChasquiTask, discover_tasks
from chasqui_core.engine.ops import cancel, lookup
from chasqui_core.engine.timing import delayed as delayed_mod
from chasqui_core.models import AuditEntry
from chasqui_core.services.audit import record
from chasqui_core.services.common import (
    Conflict,
    InvalidInput,
    NotFound,
    Source,
    backend,
    check_source,
    engine_errors,
    require,
    known_queues,
    redis_client,
    require_queue,
)

LOOKUP_SCAN_LIMIT = 200_000
"""Entries read at most per place (stream, delayed set, DLQ) of each queue when looking a job up."""


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


class NotFoundNearby(NotFound):
    """A narrow lookup (``find_job(wide=False)``) found the job nowhere its id leads, and left places unread
    where a wide one may still find it."""


def find_job(actor, job_id: str, *, source: Source = "api", wide: bool = True) -> lookup.JobLookup:
    """Where a job is now, in any queue and any state; NotFound, saying where it looked, when it is nowhere.

    ``wide=False`` reads only where the id leads (the console's first look: milliseconds whatever the queues
    hold) and raises ``NotFoundNearby`` when it left places unread. The lookup's data is the engine's,
    unmasked: callers mask what they show (the API's schema and the console's templates do).
    """
    require(actor, access.VIEW, source)
    if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
        raise InvalidInput("job_id must be a non-empty string of at most 200 characters")
    with engine_errors:
        found = lookup.find_job(redis_client(), job_id, known_queues(), scan_limit=LOOKUP_SCAN_LIMIT, wide=wide)
    if not found.found:
        raise (NotFoundNearby if found.narrowed else NotFound)(not_found_message(found))
    with engine_errors:
        return lookup.watching(redis_client(), found)


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What cancelling a job did."""

    job_id: str
    queue: str
    state: str
    """Where the job was when the cancel was asked for: waiting, delayed or running."""
    requested_ms: int
    moved_from_delayed: bool


def cancel_job(actor, job_id: str, *, source: Source) -> CancelOutcome:
    """Cancel a waiting, delayed or running job (engine/ops/cancel.py); Conflict when it has already ended.

    A waiting or delayed job never runs; a running async job is cancelled
    within a second; a running sync job is told, and given up after the
    worker's grace. The job ends in the DLQ with reason ``cancelled``.
    Needs ``discard_jobs``, the permission that already cancels delayed jobs.
    """
    check_source(source)
    require(actor, access.DISCARD, source)
    if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
        raise InvalidInput("job_id must be a non-empty string of at most 200 characters")
    client = redis_client()
    with engine_errors:
        found = lookup.find_job(client, job_id, known_queues(), scan_limit=LOOKUP_SCAN_LIMIT)
    if not found.found or found.queue is None:
        raise NotFound(not_found_message(found))
    if found.state == "dead":
        raise Conflict(f"Job {job_id!r} is in the dead-letter queue of {found.queue!r}: it is not running and will "
                       "not run unless replayed; discard it instead")
    if found.state == "finished":
        raise Conflict(f"Job {job_id!r} has finished already ({(found.result or {}).get('status', 'done')}): "
                       "there is nothing left to cancel")
    with engine_errors:
        member = None
        if found.state == "delayed":
            delayed_job = delayed_mod.find(client, found.queue, job_id)
            member = delayed_job.member if delayed_job is not None else None
        request = cancel.request(client, found.queue, job_id, member)
    record(actor, AuditEntry.Action.CANCEL_JOB, source=source, queue=found.queue, target_ids=[job_id], count=1,
           detail={"state": found.state})
    return CancelOutcome(job_id, found.queue, str(found.state), request.requested_ms, request.moved_from_delayed)


def not_found_message(found: lookup.JobLookup) -> str:
    """Why a lookup came back empty, and how sure that is."""
    where = "; ".join(found.searched) or "no queue is known"
    if found.narrowed:
        verdict = (f"Job {found.job_id!r} is not where its id leads (its marks, stored result, the dead-letter "
                   "index, the stream near the time in its id); the rest of the queues was not read, so it may "
                   "still be there")
    elif found.complete:
        verdict = (f"No job {found.job_id!r} in any queue: it is not waiting, running, delayed or dead, and no "
                   "result is stored for it (finished jobs are kept only with RESULT_TTL on)")
    else:
        verdict = (f"Job {found.job_id!r} was not found, but some places were too big to read whole: it may still "
                   f"be there")
    return f"{verdict}. Searched {found.scanned:,} entries: {where}."


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
    priority: int | None = None,
    source: Source,
) -> TaskResult:
    """Enqueue a registered task of the project by name (queue None: the task's own queue)."""
    check_source(source)
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
                                             backoff=backoff, job_id=job_id, priority=priority)
        result = configured.enqueue(*args, **kwargs)
    detail = {"task": task_name, "delay_ms": delay_ms, "attempts": attempts, "job_id_given": job_id is not None,
              "priority": configured.priority}
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
