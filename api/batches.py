"""Workflows: a batch or a chain by id (chasqui_core.flows), with its counts, children and callbacks."""

from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import WithJsonSchema

from .auth import needs
from .errors import CHANGE, READ
from chasqui_core.engine.flows.batches import ID_PATTERN
from chasqui_core.masking import mask
from chasqui_core.services import batches as batches_service

router = Router(tags=["batches"])

BatchId = Annotated[str, WithJsonSchema({
    "type": "string", "maxLength": 200, "pattern": ID_PATTERN,
    "description": "A batch's or chain's id, as enqueue() returned it: <queue>:<id>.",
})]
"""The schema publishes the rule; an id outside it is answered in words by the service (422)."""


class BatchChildOut(Schema):
    job_id: str
    state: str
    """pending, succeeded, dead or discarded."""
    result: Any = None
    """Its return value once it succeeded (masked)."""


class BatchCallbackOut(Schema):
    name: str
    """success (runs once every child succeeded) or complete (once every child ended)."""
    job_id: str
    fired: bool


class BatchOut(Schema):
    id: str
    kind: str
    """batch, or chain (whose children are its steps' jobs, in order)."""
    status: str
    """running, succeeded, failed (a batch with a dead or discarded child) or stopped (a chain whose step died)."""
    total: int
    succeeded: int
    dead: int
    discarded: int
    pending: int
    steps: int
    stopped_at: int | None
    callbacks: list[BatchCallbackOut]
    children: list[BatchChildOut]


@router.get("/batches/{batch_id}", response={200: BatchOut, **READ}, summary="A batch or chain and its children",
            auth=needs("view_queues"))
def get_batch(request: HttpRequest, batch_id: BatchId):
    """A workflow started with chasqui_core.flows: its status, counts, callbacks (with their jobs) and each
    child's state and result (masked), in the order given. 404 when there is none or it expired. Needs
    view_queues."""
    status = batches_service.get_batch(request.auth, batch_id)
    children = [BatchChildOut(job_id=j, state=st, result=mask(r) if st == "succeeded" else None)
                for j, st, r in zip(status.children, status.states, status.child_results, strict=True)]
    return BatchOut(id=status.id, kind=status.kind, status=status.status, total=status.total,
                    succeeded=status.succeeded, dead=status.dead, discarded=status.discarded,
                    pending=status.pending, steps=status.steps, stopped_at=status.stopped_at,
                    callbacks=[BatchCallbackOut(name=n, job_id=c.job_id, fired=c.fired)
                               for n, c in status.callbacks.items()],
                    children=children)



class BatchCancelOut(Schema):
    batch_id: str
    cancelled: int
    """Children (or chain steps) not yet ended that were asked to stop."""


@router.post("/batches/{batch_id}/cancel", response={200: BatchCancelOut, **CHANGE}, summary="Cancel a batch",
             auth=needs("discard_jobs"))
def cancel_batch(request: HttpRequest, batch_id: BatchId):
    """Cancel every child of a batch, or job of a chain, that has not ended: they end in the dead-letter queue
    as cancelled, which fires the batch's on_complete and never its on_success. Needs discard_jobs."""
    count = batches_service.cancel_batch(request.auth, batch_id, source="api")
    return BatchCancelOut(batch_id=batch_id, cancelled=count)


class BatchReplayOut(Schema):
    batch_id: str
    dead: int
    """Children (or chain steps' jobs) the batch counted dead when asked."""
    replayed: int
    """Of them, sent back to work from the dead-letter queue (the rest were no longer there)."""


@router.post("/batches/{batch_id}/replay-dead", response={200: BatchReplayOut, **CHANGE},
             summary="Replay a batch's dead children", auth=needs("replay_jobs"))
def replay_dead_children(request: HttpRequest, batch_id: BatchId):
    """Replay every dead child of a batch, or dead step of a chain, from the dead-letter queue, each with its
    whole retry budget: one that succeeds counts as succeeded, and fires on_success once when it is the last.
    Audited as a replay. Needs replay_jobs."""
    done = batches_service.replay_dead_children(request.auth, batch_id, source="api")
    return BatchReplayOut(batch_id=batch_id, dead=done.dead, replayed=done.replayed)
