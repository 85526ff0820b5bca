"""Workflows on Django's tasks: batches with callbacks, chains and fan-in.

::

    from chasqui_core.flows import step, chain, batch, get_batch

    batch([step(resize, i) for i in ids], on_success=step(notify, user_id), on_complete=step(cleanup, job))
    chain(step(fetch, url), step(parse), step(store, table="t"))      # each step gets the previous result first
    chain(batch([step(square, i) for i in range(10)]), step(total))   # total gets the list, in order
    handle = chain(...).enqueue(); get_batch(handle.id)               # status, counts, results

Every callback and every chain step after the first is enqueued by the atomic
call that settles the job making it due (engine/flows/), so it runs once
whatever crashes, restarts or replays happen. A workflow runs on one queue:
its keys share that queue's hash tag. Inside ``transaction.atomic()`` a
workflow waits for the commit as a plain enqueue does (the backend's
``ENQUEUE_ON_COMMIT`` or ``OUTBOX``), and a rollback sends nothing. See
docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.tasks import Task

from chasqui_core import outbox
from chasqui_core.backend import ChasquiBackend
from chasqui_core.engine.flows import batches
from chasqui_core.engine.flows.batches import BatchState, Callback, UnknownBatch
from chasqui_core.engine.flows.compose import (BatchSpec, Prepared, WorkflowError, prepare_batch, prepare_chain,
                                               read_chain, send)
from chasqui_core.engine.flows.refs import FLOW
from chasqui_core.engine.producer.queue import JobSpec, Queue

__all__ = ["Batch", "BatchStatus", "Chain", "Handle", "Step", "UnknownBatch", "WorkflowError", "add_to_batch",
           "batch", "chain", "get_batch", "step"]


@dataclass(frozen=True)
class Step:
    """A deferred call of a task (its ``.using()`` options kept), run when its workflow says."""

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def step(task: Task, *args: Any, **kwargs: Any) -> Step:
    """A deferred call of ``task``; in a chain, the previous step's result is passed before ``args``."""
    if not isinstance(task, Task):
        raise WorkflowError(f"step() takes a task (a function decorated with @task), got {type(task).__name__}")
    return Step(task, args, kwargs)


@dataclass(frozen=True)
class Handle:
    """A started workflow: read it with ``get_batch(handle.id)``."""

    id: str
    job_ids: list[str]


def _backend(s: Step) -> ChasquiBackend:
    backend = s.task.get_backend()
    if not isinstance(backend, ChasquiBackend):
        raise WorkflowError(f"task {s.task.name} uses backend {type(backend).__name__}: workflows need Chasqui's")
    return backend


def _specs(steps: Sequence[Step]) -> tuple[Queue, ChasquiBackend, list[JobSpec]]:
    """Each step's JobSpec, checked to share one queue (a workflow's keys live in its queue's slot)."""
    if not steps:
        raise WorkflowError("a workflow needs at least one step")
    backend = _backend(steps[0])
    queue = None
    specs = []
    for s in steps:
        if not isinstance(s, Step):
            raise WorkflowError(f"expected a step(task, ...), got {type(s).__name__}")
        q, spec = _backend(s).job_spec(s.task, list(s.args), dict(s.kwargs))
        if queue is not None and q.name != queue.name:
            raise WorkflowError(f"a workflow runs on one queue: {s.task.name} runs on {q.name!r}, the workflow on "
                                f"{queue.name!r}; pass .using(queue_name={queue.name!r})")
        queue = q
        specs.append(spec)
    assert queue is not None
    return queue, backend, specs


def _enqueue(queue: Queue, backend: ChasquiBackend, prepared: Prepared) -> Handle:
    """Send a built workflow as the backend sends a job: at once, or, inside ``transaction.atomic()`` with
    ``ENQUEUE_ON_COMMIT`` or ``OUTBOX``, once the transaction commits (nothing on a rollback).

    Through the outbox the whole start is one row, relayed by one idempotent ``flow_start.lua`` call: the
    workflow reaches Redis whole or not at all, and a row relayed twice starts it once.
    """
    started = prepared.started
    if (backend.outbox or backend.enqueue_on_commit) and connection.in_atomic_block:
        if backend.outbox:
            outbox.stage_workflow(queue.name, started.id, prepared.encoded(), queue_for=backend.outbox_queue)
        else:
            transaction.on_commit(lambda: send(queue, prepared))
    else:
        send(queue, prepared)
    return Handle(started.id, started.job_ids)


@dataclass(frozen=True)
class Batch:
    """Children that run side by side; ``on_success`` once all succeeded, ``on_complete`` once all ended."""

    children: list[Step]
    on_success: Step | None = None
    on_complete: Step | None = None

    def _all(self) -> list[Step]:
        return [*self.children, *(c for c in (self.on_success, self.on_complete) if c is not None)]

    def _spec(self, specs: list[JobSpec]) -> BatchSpec:
        n = len(self.children)
        rest = iter(specs[n:])
        return BatchSpec(specs[:n], next(rest) if self.on_success else None,
                         next(rest) if self.on_complete else None)

    def enqueue(self) -> Handle:
        if not self.children and self.on_success is None and self.on_complete is None:
            raise WorkflowError("an empty batch without callbacks does nothing")
        queue, backend, specs = _specs(self._all())
        return _enqueue(queue, backend, prepare_batch(queue, self._spec(specs)))


def batch(children: Sequence[Step], *, on_success: Step | None = None, on_complete: Step | None = None) -> Batch:
    return Batch(list(children), on_success, on_complete)


@dataclass(frozen=True)
class Chain:
    """Steps run one after another, each given the previous result first (a batch first: its results in order)."""

    steps: list[Step | Batch]

    def enqueue(self) -> Handle:
        flat: list[Step] = []
        for s in self.steps:
            flat += s._all() if isinstance(s, Batch) else [s]
        queue, backend, specs = _specs(flat)
        built: list[JobSpec | BatchSpec] = []
        at = 0
        for s in self.steps:
            if isinstance(s, Batch):
                n = len(s._all())
                built.append(s._spec(specs[at:at + n]))
                at += n
            else:
                built.append(specs[at])
                at += 1
        return _enqueue(queue, backend, prepare_chain(queue, built))


def chain(*steps: Step | Batch) -> Chain:
    return Chain(list(steps))


def add_to_batch(context: Any, *children: Step) -> list[str]:
    """From a running child (a task with ``takes_context=True``), add ``children`` to its own batch: the batch
    is not complete before they are. Returns their job ids."""
    run = getattr(context, "_run", None)
    job = getattr(run, "job", None)
    flow = job.meta.get(FLOW) if job is not None else None
    if flow is None:
        raise WorkflowError("add_to_batch() is for a task running as a child of a batch (pass its context)")
    queue, _, specs = _specs(list(children))
    if queue.name != batches.queue_of(flow):
        raise WorkflowError(f"the batch runs on queue {batches.queue_of(flow)!r}, these steps on {queue.name!r}")
    built = [queue.build(JobSpec(s.task, s.args, s.kwargs, **_options(s), meta={**(s.meta or {}), FLOW: flow}))
             for s in specs]
    batches.add(queue.redis, queue.keys, flow, job.id, [(b.job_id, b.payload) for b in built])
    return [b.job_id for b in built]


def _options(spec: JobSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in ("job_id", "attempts", "backoff", "result_ttl", "idempotency_key",
                                                   "idempotency_ttl", "timeout", "limit_key", "priority")}


@dataclass(frozen=True)
class BatchStatus:
    """A batch or a chain as read now: ``status`` is running, succeeded, failed (a batch with a dead or
    discarded child) or stopped (a chain whose step died: ``stopped_at``)."""

    id: str
    kind: str
    status: str
    total: int
    """Children (a chain: steps); ``succeeded``, ``dead`` and ``discarded`` count the same things."""
    succeeded: int
    dead: int
    discarded: int
    results: list[Any]
    """A batch: each child's return value in order. A chain: each step's (a batch step's as the list)."""
    children: list[str]
    states: list[str]
    callbacks: dict[str, Callback]
    child_results: list[Any] = field(default_factory=list)
    """Each child's return value, in the order of ``children`` (None until it succeeds)."""
    steps: int = 0
    stopped_at: int | None = None
    """The chain's step (1-based) that died: the chain goes on if it is replayed and succeeds."""

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.dead - self.discarded


def _of_batch(state: BatchState) -> BatchStatus:
    return BatchStatus(state.id, "batch", state.status, state.total, state.succeeded, state.dead, state.discarded,
                       state.results, state.children, state.states, state.callbacks, state.results)


def _of_chain(chain_id: str, steps: list[BatchState]) -> BatchStatus:
    stopped = next((k + 1 for k, s in enumerate(steps) if s.status == "failed"), None)
    last = steps[-1]
    status = "succeeded" if last.status == "succeeded" else "stopped" if stopped else "running"
    done = sum(1 for s in steps if s.status == "succeeded")
    dead = sum(1 for s in steps if s.dead)
    gone = sum(1 for s in steps if s.discarded and not s.dead)
    results = [s.results[0] if len(s.results) == 1 else s.results for s in steps]
    return BatchStatus(chain_id, "chain", status, len(steps), done, dead, gone, results,
                       [c for s in steps for c in s.children], [st for s in steps for st in s.states],
                       steps[0].callbacks, [r for s in steps for r in s.results], len(steps), stopped)


def read_status(client: Any, batch_id: str) -> BatchStatus:
    """A batch's or a chain's state read with ``client``; ``UnknownBatch`` when none has this id (or it expired),
    ValueError when the id is not a batch id."""
    try:
        return _of_batch(batches.read(client, batch_id))
    except UnknownBatch:
        try:
            return _of_chain(batch_id, read_chain(client, batch_id))
        except UnknownBatch:
            raise UnknownBatch(f"no batch or chain {batch_id!r}: it never existed, or it ended long enough ago "
                               "to expire") from None


def get_batch(batch_id: str, *, backend: str = "default") -> BatchStatus:
    """A batch's or a chain's state; ``UnknownBatch`` when none has this id (or it expired)."""
    from django.tasks import task_backends

    chasqui = task_backends[backend]
    if not isinstance(chasqui, ChasquiBackend):
        raise WorkflowError(f"backend {backend!r} is not Chasqui's")
    return read_status(chasqui.client, batch_id)
