"""Workflows as a producer describes them: batches with callbacks, and chains, turned into batch records.

A batch is written with its children and callbacks before any child can end
(``batches.start``). A chain of n steps is n batches written at once: step k
is the only child of batch k (or, for a first step that is a batch, its
children), and batch k's ``success`` callback is step k+1, fed step k's
result (``one``) or its batch's results in order (``all``). So each step is
enqueued by the script that settles the step before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from chasqui_core.engine.flows import batches
from chasqui_core.engine.flows.callbacks import stored
from chasqui_core.engine.flows.refs import AFTER, FLOW
from chasqui_core.engine.producer.queue import BuiltJob, JobSpec, Queue


@dataclass(slots=True)
class BatchSpec:
    """Jobs that run side by side, and what runs once when they are done."""

    children: list[JobSpec]
    on_success: JobSpec | None = None
    """Enqueued once, when every child has succeeded (a dead child replayed to success counts)."""
    on_complete: JobSpec | None = None
    """Enqueued once, when every child has succeeded or died (dead-lettered, or discarded from there)."""


@dataclass(frozen=True, slots=True)
class Started:
    """A workflow that was started: its id (``batches.read`` for a batch, ``read_chain`` for a chain)."""

    id: str
    job_ids: list[str] = field(default_factory=list)
    """The jobs added now, in order: a batch's children, or a chain's first step."""


@dataclass(slots=True)
class Prepared:
    """A workflow built and checked, not sent yet: what ``send`` writes in one call (now, or once the caller's
    database transaction commits)."""

    started: Started
    plans: list[batches.BatchPlan]
    jobs: list[bytes]
    """The envelopes of the jobs that run first."""

    def encoded(self) -> bytes:
        """The start call's arguments as bytes, for a row that waits for a commit (``batches.start_encoded``)."""
        return batches.encode_start(self.plans, self.jobs)


def send(queue: Queue, prepared: Prepared) -> Started:
    """Write a prepared workflow's batches and add its first jobs, atomically; a repeated send adds nothing."""
    batches.start(queue.redis, queue.keys, prepared.plans, prepared.jobs)
    return prepared.started


class WorkflowError(ValueError):
    """A workflow that cannot be built as described; the message says what to change."""


def _member(queue: Queue, spec: JobSpec, batch_id: str) -> BuiltJob:
    if spec.delay is not None or spec.run_at is not None:
        raise WorkflowError(f"step {spec.task} has a delay or run_at: a workflow's steps run when they are due")
    return queue.build(replace(spec, meta={**(spec.meta or {}), FLOW: batch_id}))


def _callback(queue: Queue, spec: JobSpec, which: str, after: str) -> list[object]:
    """A batch's callback as its hash stores it; its meta names the batch (``AFTER``) for operators' pages."""
    if spec.delay is not None or spec.run_at is not None:
        raise WorkflowError(f"callback {spec.task} has a delay or run_at: a callback runs when it is due")
    built = queue.build(replace(spec, meta={**(spec.meta or {}), AFTER: after}))
    return stored(which, built.job_id, built.payload)


def start_batch(queue: Queue, spec: BatchSpec) -> Started:
    """Start one batch on ``queue``: its children now, its callbacks when they are due."""
    return send(queue, prepare_batch(queue, spec))


def prepare_batch(queue: Queue, spec: BatchSpec) -> Prepared:
    """One batch on ``queue`` built and checked (its id and job ids fixed), ready to ``send``."""
    batch_id = batches.new_batch_id(queue.name)
    children = [_member(queue, child, batch_id) for child in spec.children]
    fields: list[object] = []
    if spec.on_success is not None:
        fields += _callback(queue, spec.on_success, "success", batch_id)
    if spec.on_complete is not None:
        fields += _callback(queue, spec.on_complete, "complete", batch_id)
    plan = batches.BatchPlan(batch_id, [c.job_id for c in children], fields)
    return Prepared(Started(batch_id, [c.job_id for c in children]), [plan], [c.payload for c in children])


def start_chain(queue: Queue, steps: list[JobSpec | BatchSpec]) -> Started:
    """Start a chain on ``queue``: its first step now, each next step when the one before succeeds."""
    return send(queue, prepare_chain(queue, steps))


def prepare_chain(queue: Queue, steps: list[JobSpec | BatchSpec]) -> Prepared:
    """A chain on ``queue`` built and checked (its id and first jobs fixed), ready to ``send``."""
    if len(steps) < 2:
        raise WorkflowError("a chain needs at least two steps")
    chain_id = batches.new_batch_id(queue.name)
    ids = [f"{chain_id}-{k}" for k in range(1, len(steps) + 1)]
    plans: list[batches.BatchPlan] = []
    first: list[BuiltJob] = []
    member: BuiltJob | None = None
    for k, step in enumerate(steps):
        where = ["chain", chain_id, "step", k + 1, "steps", len(steps)]
        if isinstance(step, BatchSpec):
            if k:
                raise WorkflowError(f"step {k + 1} is a batch: only a chain's first step may be a batch")
            if step.on_success is not None:
                raise WorkflowError("a batch that starts a chain hands its success to the next step: "
                                    "give it no on_success")
            first = [_member(queue, child, ids[0]) for child in step.children]
            kids = [c.job_id for c in first]
            if step.on_complete is not None:
                where += _callback(queue, step.on_complete, "complete", chain_id)
        elif k == 0:
            first = [_member(queue, step, ids[0])]
            kids = [first[0].job_id]
        else:
            assert member is not None
            kids = [member.job_id]
        if k + 1 < len(steps):
            nxt = steps[k + 1]
            if isinstance(nxt, BatchSpec):
                raise WorkflowError(f"step {k + 2} is a batch: only a chain's first step may be a batch")
            member = _member(queue, nxt, ids[k + 1])
            where += stored("success", member.job_id, member.payload, "all" if isinstance(step, BatchSpec) else "one")
        plans.append(batches.BatchPlan(ids[k], kids, where))
    return Prepared(Started(chain_id, [c.job_id for c in first]), plans, [c.payload for c in first])


def read_chain(client: object, chain_id: str) -> list[batches.BatchState]:
    """The batches of a chain's steps, in order; ``batches.UnknownBatch`` when there is no such chain."""
    head = batches.read(client, f"{chain_id}-1")
    states = [head]
    for k in range(2, head.steps + 1):
        states.append(batches.read(client, f"{chain_id}-{k}"))
    return states
