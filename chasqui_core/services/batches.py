"""Workflows as operators see them: a batch or a chain by id, with its counts, children and callbacks."""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core import access
from chasqui_core.engine.dlq.browse import DLQReader
from chasqui_core.engine.flows.batches import queue_of
from chasqui_core.engine.ops import cancel
from chasqui_core.flows import BatchStatus, UnknownBatch, read_status
from chasqui_core.models import AuditEntry
from chasqui_core.services import dlq as dlq_service
from chasqui_core.services.audit import record
from chasqui_core.services.common import (InvalidInput, NotFound, Source, check_source, engine_errors, redis_client,
                                          require)

AUDITED_IDS = 100
"""Job ids a batch cancel's audit entry lists (the count covers them all)."""


def get_batch(actor, batch_id: str, *, source: Source = "api") -> BatchStatus:
    """A batch's or a chain's state now; NotFound when there is none (or it expired), InvalidInput for an id
    that cannot be one. The data is the engine's, unmasked: callers mask what they show."""
    require(actor, access.VIEW, source)
    if not isinstance(batch_id, str) or not batch_id or len(batch_id) > 200:
        raise InvalidInput("batch_id must be a non-empty string of at most 200 characters")
    try:
        with engine_errors:
            return read_status(redis_client(), batch_id)
    except UnknownBatch as exc:
        raise NotFound(str(exc)) from None
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def cancel_batch(actor, batch_id: str, *, source: Source) -> int:
    """Cancel every child of a batch (or job of a chain) that has not ended: each waiting or delayed one never
    runs, a running one is stopped as a cancelled job is, and a chain's later steps are refused when they come.
    They end in the DLQ as ``cancelled``, which counts as their end (``on_complete`` fires, ``on_success``
    does not). Returns how many were asked to stop. Needs ``discard_jobs``, like cancelling one job."""
    check_source(source)
    require(actor, access.DISCARD, source)
    status = get_batch(actor, batch_id, source=source)
    queue = queue_of(batch_id)
    pending = [j for j, state in zip(status.children, status.states, strict=True) if state == "pending"]
    client = redis_client()
    with engine_errors:
        for job_id in pending:
            cancel.request(client, queue, job_id)
    record(actor, AuditEntry.Action.CANCEL_JOB, source=source, queue=queue, target_ids=pending[:AUDITED_IDS],
           count=len(pending), detail={"batch": batch_id})
    return len(pending)


LOOKUP_CHUNK = 1000
"""Dead children's entry ids read from the DLQ's index per command."""


@dataclass(frozen=True, slots=True)
class ChildrenReplayed:
    """What a replay of a batch's dead children did."""

    dead: int
    """Children (a chain: steps' jobs) the batch counted dead when asked."""
    replayed: int
    """Of them, sent back to work; the rest were no longer in the dead-letter queue (replayed or trimmed)."""


def _entries_of(client, queue: str, job_ids: list[str]) -> list[str]:
    """The dead-letter entry ids of ``job_ids``: from the DLQ's index, one command per 1,000 jobs, or found one
    by one by a bounded scan while the index is being built."""
    reader = DLQReader(client, queue)
    if reader.index_state().ready:
        found = []
        for start in range(0, len(job_ids), LOOKUP_CHUNK):
            found += client.hmget(reader.index.ix.jobs, job_ids[start:start + LOOKUP_CHUNK])
        return [f.decode() for f in found if f is not None]
    return [d.entry_id for j in job_ids if (d := reader.find_by_job_id(j)) is not None]


def replay_dead_children(actor, batch_id: str, *, source: Source) -> ChildrenReplayed:
    """Send every dead child of a batch (or dead step of a chain) back to work, through the DLQ's replay (its
    audit entry included), each with its whole retry budget. One that then succeeds ends the batch as
    succeeded: ``on_success`` fires, once, when it is the last. Needs ``replay_jobs``, like any replay."""
    check_source(source)
    require(actor, access.REPLAY, source)
    status = get_batch(actor, batch_id, source=source)
    queue = queue_of(batch_id)
    dead = [j for j, state in zip(status.children, status.states, strict=True) if state == "dead"]
    if not dead:
        return ChildrenReplayed(0, 0)
    with engine_errors:
        entries = _entries_of(redis_client(), queue, dead)
    if not entries:
        return ChildrenReplayed(len(dead), 0)
    count = dlq_service.replay(actor, queue, ids=entries, source=source, background=False)
    assert isinstance(count, int)  # by ids: always inline
    return ChildrenReplayed(len(dead), count)
