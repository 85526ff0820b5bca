"""The delayed set: scheduled runs and retries waiting, cancelled or run at once by hand."""

from __future__ import annotations

from chasqui_core import access
from chasqui_core.engine.timing import delayed as delayed_mod
from chasqui_core.models import AuditEntry
from chasqui_core.services.audit import record
from chasqui_core.services.common import (
    NotFound,
    Source,
    check_source,
    engine_errors,
    page_limit,
    redis_client,
    require,
    require_queue,
)


def delayed_page(
    actor, queue: str, *, cursor: str | None = None, limit: int = 50, source: Source = "api"
) -> delayed_mod.DelayedPage:
    """Delayed jobs (scheduled runs and retries waiting), soonest first."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    limit = page_limit(limit)
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


def cancel_delayed(actor, queue: str, job_id: str, *, source: Source) -> None:
    """Remove one delayed job for good; NotFound when it is no longer delayed."""
    check_source(source)
    require(actor, access.DISCARD, source)
    queue = require_queue(queue)
    with engine_errors:
        cancelled = delayed_mod.cancel(redis_client(), queue, job_id)
    if not cancelled:
        raise NotFound(_no_delayed(queue, job_id))
    record(actor, AuditEntry.Action.CANCEL_DELAYED, source=source, queue=queue, target_ids=[job_id], count=1)


def run_delayed_now(actor, queue: str, job_id: str, *, source: Source) -> str:
    """Move one delayed job to the stream at once; returns its new stream entry id."""
    check_source(source)
    require(actor, access.ENQUEUE, source)
    queue = require_queue(queue)
    with engine_errors:
        entry_id = delayed_mod.run_now(redis_client(), queue, job_id)
    if entry_id is None:
        raise NotFound(_no_delayed(queue, job_id))
    record(actor, AuditEntry.Action.RUN_DELAYED_NOW, source=source, queue=queue, target_ids=[job_id], count=1,
           detail={"entry_id": entry_id})
    return entry_id


def _no_delayed(queue: str, job_id: str) -> str:
    return (f"No delayed job {job_id!r} in queue {queue!r}: it already ran, was cancelled, "
            f"or the id is wrong")
