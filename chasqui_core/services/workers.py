"""Workers, as their heartbeats show them; their running jobs; asking one to quiet down or to stop."""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core import access
from chasqui_core.engine.ops import control, stats
from chasqui_core.engine.ops.running_jobs import RunningPage, running_jobs
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.models import AuditEntry
from chasqui_core.services.audit import record
from chasqui_core.services.common import (
    InvalidInput,
    NotFound,
    Source,
    check_source,
    engine_errors,
    redis_client,
    require,
    require_queue,
)

MAX_WORKER_ID = 300


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


def _find(worker_id: str) -> stats.WorkerInfo:
    if not isinstance(worker_id, str) or not worker_id or len(worker_id) > MAX_WORKER_ID:
        raise InvalidInput(f"A worker id is the text the workers list shows (1 to {MAX_WORKER_ID} characters).")
    for info in stats.workers(redis_client()):
        if info.id == worker_id:
            return info
    raise NotFound(f"No worker {worker_id!r} has a heartbeat: it stopped, or the id is wrong.")


def worker_detail(actor, worker_id: str, *, source: Source = "api") -> stats.WorkerInfo:
    """One worker from its heartbeat; NotFound when it has none."""
    require(actor, access.VIEW, source)
    return _find(worker_id)


def worker_running(actor, worker_id: str, *, offset: int = 0, limit: int = 50,
                   source: Source = "api") -> RunningPage:
    """The runs under way on a worker, oldest first, paged (from its start journals, not its heartbeat)."""
    require(actor, access.VIEW, source)
    info = _find(worker_id)
    with engine_errors:
        return running_jobs(redis_client(), info.id, info.queues, offset=offset, limit=limit)


@dataclass(frozen=True, slots=True)
class CommandSent:
    worker: stats.WorkerInfo
    command: str
    changed: bool
    """False when the worker had been asked already (or told to stop, which a quiet does not undo)."""


def quiet(actor, worker_id: str, *, source: Source) -> CommandSent:
    """Ask a worker to take no more jobs and finish those it runs (control.py); needs pause_queues."""
    return _command(actor, worker_id, control.QUIET, AuditEntry.Action.WORKER_QUIET, source)


def stop(actor, worker_id: str, *, source: Source) -> CommandSent:
    """Ask a worker to stop as SIGTERM does: its running jobs finish, the rest go back; needs pause_queues.

    A worker under a ``runworker --processes`` supervisor is not replaced: its slot stays empty.
    """
    return _command(actor, worker_id, control.STOP, AuditEntry.Action.WORKER_STOP, source)


def _command(actor, worker_id: str, command: control.Command, action: str, source: str) -> CommandSent:
    check_source(source)
    require(actor, access.PAUSE, source)
    info = _find(worker_id)
    if info.stale:
        raise NotFound(f"Worker {worker_id!r} has not sent a heartbeat lately: it cannot hear a command.")
    client = redis_client()
    changed = control.send(Scripts(client), info.id, command)
    record(actor, action, source=source, queue=",".join(info.queues)[:100], target_ids=[info.id],
           count=1 if changed else 0, detail={"changed": changed, "host": info.host, "pid": info.pid})
    return CommandSent(info, command, changed)
