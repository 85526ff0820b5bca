"""A delivery: one read of one stream entry, from the read until its outcome is handed to the settler.

The engine's most shared record, kept at the bottom of the worker's floors so
that every part that holds or routes deliveries (admission, the inbox, the
sync lane, the runner, the settler's callers, the limits) can name it without
importing the others.

A stream entry id is unique only within its stream: two queues, or two
priority bands of one queue, written in the same millisecond both get
``<ms>-0``, ``<ms>-1``, ... So a delivery is named by its stream *and* its
entry id, ``DeliveryRef``, and every map or set of deliveries is keyed by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from chasqui_core.engine.flows.refs import FED
from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.jobs.registry import Handler, JobContext

Bucket = tuple[str, int, int, int]
"""One limit's bucket as the Lua call takes it: key prefix, rate, window ms, concurrency (limits.py)."""


class DeliveryRef(NamedTuple):
    """A delivery's identity: its stream's key and its entry id (entry ids repeat across streams).

    Made once per entry read with ``ref_of``, which skips the named tuple's
    argument parsing (a third of the cost of ``DeliveryRef(stream, id)``).
    """

    stream: str
    entry_id: bytes


_new_tuple = tuple.__new__


def ref_of(stream: str, entry_id: bytes) -> DeliveryRef:
    """The reference of entry ``entry_id`` of ``stream``."""
    return _new_tuple(DeliveryRef, (stream, entry_id))


@dataclass(slots=True, eq=False)
class Delivery:
    """A job fetched from a stream and accepted for running, until its outcome is written.

    Compared by identity: a delivery is one read of one entry, whatever it holds.
    """

    keys: QueueKeys
    entry_id: bytes
    payload: bytes
    """The envelope as the stream holds it, or with this read's lost runs charged (what a requeue writes back)."""
    job: Job
    handler: Handler
    ref: DeliveryRef
    """Which entry of which stream: the key of every map and set that holds deliveries."""
    max_attempts: int = 0
    """The job's budget of runs (see retry.budget), for the JobContext."""
    idempotency_key: str | None = None
    """The job's idempotency key, when it has one: its success marks the key completed (idempotency.py)."""
    timeout: float | None = None
    """Seconds this run may take (the job's, its task's or the worker's); None: no limit."""
    started: int = 0
    """When the handler started (epoch ms); 0 while the job waits in the worker."""
    journal: Any = None
    """The start journal holding this run's mark (journal.StartJournal), until the mark is struck; None while
    unmarked. The first to see the run end strikes it (``end_run``)."""
    end_noted: bool = False
    """The run's end is noted on the host already (``note_end``), though its mark is not struck yet."""
    timed_out: bool = False
    """Set when the run passed its timeout: an async run is being cancelled, a sync run was abandoned."""
    timer: Any = None
    """The loop's timer that cancels an async run at its timeout, while the run waits on something."""
    limits: tuple[Bucket, ...] | None = None
    """The rate and concurrency buckets the job falls under (limits.py); None for most jobs."""
    slots: tuple[str, ...] = ()
    """Key prefixes of the concurrency buckets it holds a slot in, given back when the run ends."""
    slot_until: float = 0.0
    """The monotonic time until which those slots are known held (taken or renewed, plus their lease, less a
    margin); a job still waiting then takes them again before it starts (limits.LimitGate.late). 0.0: no slot."""
    rate_by: float = 0.0
    """Under a rate limit: the monotonic time by which it must start on its rate token, else it takes the token
    again first (limits.LimitGate.late, retake); 0.0: no rate limit."""
    task: Any = None
    """The asyncio task of an async run that waited on something (what a cancel request cancels)."""
    cancel_requested: int = 0
    """When a cancel of this job was asked for (server ms, cancel.py); 0: it was not."""
    taken_back: bool = False
    """Another worker took its entry back while this one held it (this one was silent past the visibility
    timeout): it must not start here, and a run under way here has its outcome dropped (``Runner.let_go``)."""
    cancel_seen: int = 0
    """When this worker saw that request (its clock): a sync run's grace counts from here."""
    suspect: bool = False
    """It may have killed a worker: charged a death, or taken back from a dead worker that was about to start it
    (its entry's ``recovered`` count). It runs alone in its process (suspects.py)."""

    def end_run(self) -> None:
        """The run has ended: strike its start mark now, once (the runner, when the handler returns, or whoever
        ends a run that did not start)."""
        journal = self.journal
        if journal is not None:
            self.journal = None
            journal.finished_one(self.keys.stream, self.entry_id, self.end_noted)

    def note_end(self) -> None:
        """The task's own code has returned or raised, and its wrapper goes on (``JobContext.run_returned``,
        before Django's signals and logging, which can take long enough on a loaded host for a crash beside it to
        land in between): note the end on the host now, where whoever records the process's death strikes the
        mark from (recovery/ended_runs.py). The strike itself is sent when the handler returns, with the next
        job's start when one waits: a second send per job would hand the GIL to the event loop's thread (a noop
        sync task through runworker cost three times the CPU)."""
        journal = self.journal
        if journal is not None and not self.end_noted:
            self.end_noted = True
            journal.noted_end(self.keys.stream, self.entry_id)

    def handler_args(self, worker_id: str) -> tuple[Any, ...] | list[Any]:
        """Positional arguments for the handler: a JobContext first when it asked for one."""
        args = self.job.args
        if FED in self.job.meta:  # a workflow's step: the value it is fed goes first (flows/refs.py)
            args = [self.job.meta[FED], *args]
        if self.handler.takes_context:
            ctx = JobContext(self.job, self.keys.queue, worker_id, self.entry_id.decode(), 1, self.max_attempts, self)
            return (ctx, *args)
        return args
