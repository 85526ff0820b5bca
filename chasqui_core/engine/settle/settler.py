"""Batched settlement of finished deliveries.

Handlers finish one at a time; Redis is told in batches. The settler buffers
outcomes per stream (a queue's, or one of its priority bands') and flushes
each buffer with one ``settle.lua`` call, off the handlers' path: a handler
never waits for its ack.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import msgpack

from chasqui_core.engine.jobs import events
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.dlq.fingerprint import error_group
from chasqui_core.engine.dlq.shared import split
from chasqui_core.engine.jobs.events import Event
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.ops.totals import duration_increments

logger = logging.getLogger("chasqui.worker")

_pack_items = msgpack.Packer(use_bin_type=False).pack
"""str types only: the scripting engine's msgpack reads raw strings, not bin."""

_task_of = itemgetter(1)
_duration_of = itemgetter(2)
"""Of a row of ``_Batch.completed``: [job id, task, duration ms]."""

SETTLE_TRIES = 30
"""About a minute of retries (capped exponential waits) per flush; then the outcomes wait for the next flush."""

# settle.lua's records, laid flat in their sections: how many items each takes (the script's header lists them).
RETRY_ITEMS = 3
"""A retry: stream id, delay ms, payload."""
DEAD_ITEMS = 12
"""A dead job: stream id, payload, reason, task, job id, error class, error, counts-as-failure, duration ms,
fingerprint id, fingerprint text, shared texts (the payload as ``dlq.shared.split`` leaves it, and its texts)."""
REQUEUE_ITEMS = 2
"""A requeue: stream id, payload."""
SKIPPED_ITEMS = 5
"""A skipped job: stream id, job id, task, idempotency key, completed by."""
RESULT_ITEMS = 4
"""A stored result: key, ttl ms, value."""
MARKER_ITEMS = 3
"""An idempotency marker: key, job id, ttl ms."""
FLOW_END_ITEMS = 5
"""A workflow child's end: stream id, batch id, job id, outcome ("ok" or "dead"), return value as msgpack."""


@dataclass(frozen=True, slots=True)
class SettleReply:
    """What one settle.lua call did (its return value, named)."""

    server_ms: int
    completed: int
    retried: int
    dead: int
    requeued: int
    earliest_retry_ms: int
    """When the earliest retry scheduled by the call is due (server ms); -1 when none was."""
    problems: list[str]
    """Items that could not be applied as asked: "stream id or result key: what went wrong"."""
    skipped: int

    @classmethod
    def of(cls, reply: list[Any]) -> SettleReply:
        server_ms, completed, retried, dead, requeued, earliest, problems, skipped = reply
        return cls(int(server_ms), int(completed), int(retried), int(dead), int(requeued), int(earliest),
                   [p.decode(errors="replace") if isinstance(p, bytes) else str(p) for p in problems], int(skipped))


@dataclass(slots=True)
class _Batch:
    done: list[bytes] = field(default_factory=list)
    completed: list[list[Any]] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    retries: list[Any] = field(default_factory=list)
    """Retries laid flat: entry id, delay ms, envelope."""
    retry_events: list[list[Any]] = field(default_factory=list)
    """The retries' entries of the events stream, in the same order: settle.lua writes them as packed here."""
    dead: list[Any] = field(default_factory=list)
    requeues: list[Any] = field(default_factory=list)
    markers: list[Any] = field(default_factory=list)
    """Idempotency markers of keyed successes, laid flat: key, job id, ttl ms."""
    skipped: list[Any] = field(default_factory=list)
    """Jobs not run (their key had completed), laid flat: entry id, job id, task, key, completed by."""
    flow_ends: list[Any] = field(default_factory=list)
    """Ends of workflow children, laid flat (FLOW_END_ITEMS); empty unless a job of a workflow ended."""
    failed_tasks: list[str] = field(default_factory=list)
    failed_ms: list[int] = field(default_factory=list)
    """Task and duration of each run that raised; successful runs are read from ``completed``."""
    n_retries: int = 0
    n_dead: int = 0
    n_requeues: int = 0
    n_skipped: int = 0
    n_fetched: int = 0
    """Entries read since the last flush (the ``fetched`` counter): written with the outcomes, not alone."""
    local_events: list[Event] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.done) + self.n_retries + self.n_dead + self.n_requeues + self.n_skipped

    def entry_ids(self) -> list[bytes]:
        """The stream ids of every outcome in the batch (each record's first item)."""
        return [*self.done, *self.retries[::RETRY_ITEMS], *self.dead[::DEAD_ITEMS], *self.requeues[::REQUEUE_ITEMS],
                *self.skipped[::SKIPPED_ITEMS]]

    def absorb(self, newer: _Batch) -> None:
        """Add the outcomes of a batch started while this one was being flushed (this one failed): order kept."""
        for name in ("done", "completed", "results", "retries", "retry_events", "dead", "requeues", "markers",
                     "skipped", "flow_ends", "failed_tasks", "failed_ms", "local_events"):
            getattr(self, name).extend(getattr(newer, name))
        self.n_retries += newer.n_retries
        self.n_dead += newer.n_dead
        self.n_requeues += newer.n_requeues
        self.n_skipped += newer.n_skipped
        self.n_fetched += newer.n_fetched


class SettleFailed(Exception):
    """A queue's outcomes could not be written after every try; the settler keeps them and tries again."""


class Settler:
    def __init__(
        self,
        client: Client,
        scripts: Scripts,
        *,
        flush_size: int = 500,
        flush_interval: float = 0.002,
        on_retry_scheduled: Callable[[str, int, int], None] | None = None,
        worker_id: str = "",
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        """Whose start journal the settled entries are struck from (journal.py); "" for none."""
        self.scripts = scripts
        self.flush_size = flush_size
        self.flush_interval = flush_interval
        self.on_retry_scheduled = on_retry_scheduled
        self._batches: dict[str, _Batch] = {}
        self._flushing: dict[str, _Batch] = {}
        """Batches whose settle.lua call is under way, by stream."""
        self._keys: dict[str, QueueKeys] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._pending = 0

    def _batch(self, keys: QueueKeys) -> _Batch:
        batch = self._batches.get(keys.stream)
        if batch is None:
            batch = self._batches[keys.stream] = _Batch()
            self._keys[keys.stream] = keys
        return batch

    def _added(self) -> None:
        self._pending += 1
        if self._pending == 1:  # idle is set only while nothing is pending: cleared once, not per outcome
            self._idle.clear()
            self._wake.set()
        elif self._pending >= self.flush_size:
            self._wake.set()

    # --- outcomes -------------------------------------------------------------

    def complete(self, keys: QueueKeys, entry_id: bytes, job_id: str, task: str, duration_ms: int,
                 result: tuple[str, int, bytes] | None = None, marker: tuple[str, int] | None = None) -> None:
        """A success; ``marker`` (key, ttl ms) marks the job's idempotency key completed in the same call."""
        batch = self._batches.get(keys.stream)  # once per job: no call when the stream's batch exists
        if batch is None:
            batch = self._batch(keys)
        batch.done.append(entry_id)
        batch.completed.append([job_id, task, duration_ms])
        if result is not None:
            batch.results += (*result, b"")
        if marker is not None:
            batch.markers += (marker[0], job_id, marker[1])
        self._added()

    def skip(self, keys: QueueKeys, entry_id: bytes, job_id: str, task: str, key: str, completed_by: str,
             result: tuple[str, int, bytes] | None = None) -> None:
        """Acknowledge a job that was not run: job ``completed_by`` completed its idempotency key."""
        batch = self._batch(keys)
        batch.skipped += (entry_id, job_id, task, key, completed_by)
        batch.n_skipped += 1
        if result is not None:
            batch.results += (*result, entry_id)
        if events.has_subscribers():
            batch.local_events.append(Event(events.SKIPPED, keys.queue, job_id, task,
                                            extra={"idempotency_key": key, "completed_by": completed_by}))
        self._added()

    def retry(self, keys: QueueKeys, entry_id: bytes, delay_ms: int, payload: bytes, *, job_id: str,
              task: str, attempt: int, error_class: str, error: str, duration_ms: int,
              result: tuple[str, int, bytes] | None = None) -> None:
        batch = self._batch(keys)
        batch.retries += (entry_id, delay_ms, payload)
        batch.retry_events.append([job_id, task, attempt, delay_ms, duration_ms, error_class, error[:500]])
        batch.n_retries += 1
        batch.failed_tasks.append(task)
        batch.failed_ms.append(duration_ms)
        if result is not None:
            batch.results += (*result, entry_id)
        if events.has_subscribers():
            batch.local_events.append(Event(events.FAILED, keys.queue, job_id, task, attempt, duration_ms=duration_ms,
                                            error_class=error_class, error_message=error))
            batch.local_events.append(Event(events.RETRY_SCHEDULED, keys.queue, job_id, task, attempt, delay_ms,
                                            error_class=error_class, error_message=error))
        self._added()

    def dead(self, keys: QueueKeys, entry_id: bytes, payload: bytes, reason: str, *, job_id: str = "",
             task: str = "", error_class: str = "", error: str = "", handler_failed: bool = False,
             duration_ms: int = 0, result: tuple[str, int, bytes] | None = None) -> None:
        batch = self._batch(keys)
        error = error[:2000]
        group, group_text = error_group(error_class, error)
        payload, texts = split(payload, error_class, error)  # what a million entries share is stored once
        batch.dead += (entry_id, payload, reason, task, job_id, error_class, error, 1 if handler_failed else 0,
                       duration_ms, group, group_text, texts)
        batch.n_dead += 1
        if handler_failed:
            batch.failed_tasks.append(task)
            batch.failed_ms.append(duration_ms)
        if result is not None:
            batch.results += (*result, entry_id)
        if events.has_subscribers():
            if handler_failed:
                batch.local_events.append(Event(events.FAILED, keys.queue, job_id, task, duration_ms=duration_ms,
                                                error_class=error_class, error_message=error))
            batch.local_events.append(Event(events.DLQ, keys.queue, job_id, task, reason=reason,
                                            error_class=error_class, error_message=error))
        self._added()

    def flow_end(self, keys: QueueKeys, entry_id: bytes, flow: str, job_id: str, outcome: str,
                 result: bytes = b"") -> None:
        """A workflow child's end, written with its outcome (queue it right after ``complete`` or ``dead``):
        settle.lua counts it in its batch and enqueues the callback it makes due, in the same call."""
        self._batch(keys).flow_ends += (entry_id, flow, job_id, outcome, result)

    def unsettled(self, keys: QueueKeys) -> list[bytes]:
        """Entry ids of a stream whose outcome waits here: their leases must be kept until it is written."""
        ids: list[bytes] = []
        for b in (self._batches.get(keys.stream), self._flushing.get(keys.stream)):
            if b is not None:
                ids += b.entry_ids()
        return ids

    def fetched(self, keys: QueueKeys, count: int) -> None:
        """Count entries read from a queue; the count rides along with that queue's next flush."""
        self._batch(keys).n_fetched += count

    def requeue(self, keys: QueueKeys, entry_id: bytes, payload: bytes) -> None:
        batch = self._batch(keys)
        batch.requeues += [entry_id, payload]
        batch.n_requeues += 1
        self._added()

    # --- flushing ---------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Flush whenever something is buffered; exits once stopped and drained."""
        while True:
            if not self._pending:
                if stop.is_set():
                    return
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                continue
            if self._pending < self.flush_size and self.flush_interval:
                await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except SettleFailed as exc:  # kept: the next flush tries again
                logger.error("%s", exc)
            except Exception:  # never let the settler die: a worker that cannot settle runs jobs twice
                logger.exception("settling failed; the outcomes are kept and tried again")

    async def flush(self) -> None:
        """Write every stream's outcomes, one ``settle.lua`` call per stream.

        Each stream's batch is kept until its own call returns: outcomes
        arriving meanwhile start a new batch, and a batch whose call failed
        goes back in front of them, so one queue's trouble drops nothing of
        its own nor of any other queue. The first failure is raised once the
        other queues have been tried.
        """
        self._pending = 0
        failure: BaseException | None = None
        for stream in list(self._batches):
            batch = self._batches.pop(stream)
            if not len(batch) and not batch.n_fetched:
                continue
            self._flushing[stream] = batch
            try:
                await self._flush_one(self._keys[stream], batch)
            except BaseException as exc:
                newer = self._batches.get(stream)
                if newer is not None:
                    batch.absorb(newer)
                self._batches[stream] = batch
                self._pending += len(batch)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                failure = failure or exc
            finally:
                self._flushing.pop(stream, None)
        if not self._pending:
            self._idle.set()
        if failure is not None:
            raise failure

    @property
    def pending(self) -> int:
        """Outcomes not yet written (0 once a flush has written them all)."""
        return self._pending

    async def drained(self) -> None:
        await self._idle.wait()

    async def _flush_one(self, keys: QueueKeys, b: _Batch) -> None:
        kwargs = settle_call(keys, self.worker_id, b)
        for attempt in range(SETTLE_TRIES):
            try:
                reply = SettleReply.of(await self.scripts.settle(**kwargs))
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting, failing over, out of memory...
                # Hold on to the outcomes and try again: the call is idempotent.
                logger.warning("settling %d outcomes on %s failed (%s: %s); retrying", len(b), keys.queue,
                               type(exc).__name__, exc)
                await asyncio.sleep(min(0.05 * 2 ** attempt, 2.0))
        else:
            raise SettleFailed(f"settling {len(b)} outcomes on {keys.queue} failed {SETTLE_TRIES} times; "
                               "they are kept and tried again")
        for problem in reply.problems:
            logger.error("settling on %s: %s", keys.queue, problem)
        if reply.earliest_retry_ms >= 0 and self.on_retry_scheduled is not None:
            self.on_retry_scheduled(keys.queue, reply.earliest_retry_ms, reply.server_ms)
        if events.has_subscribers():
            for job_id, task, duration in b.completed:
                events.publish(Event(events.COMPLETED, keys.queue, job_id, task, duration_ms=duration))
            for event in b.local_events:
                events.publish(event)


def settle_call(keys: QueueKeys, worker_id: str, b: _Batch) -> dict[str, list[Any]]:
    """settle.lua's KEYS and ARGV for one stream's batch, in the order its header lists them (the one place
    they are built; tests/engine/test_settle_contract.py runs the script with them on a real server)."""
    argv: list[Any] = [GROUP, keys.metrics, events.EVENTS_MAXLEN, msgpack.packb(b.completed) if b.completed else b""]
    argv.append(len(b.done))
    if b.done:
        argv.append(b" ".join(b.done))
    argv.append(len(b.results) // RESULT_ITEMS)
    argv += b.results
    argv.append(b.n_retries)
    if b.n_retries:
        argv += (_pack_items(b.retries), _pack_items(b.retry_events))
    argv.append(b.n_dead)
    if b.n_dead:
        argv.append(_pack_items(b.dead))
    argv.append(b.n_requeues)
    argv += b.requeues
    histogram = duration_increments([*map(_task_of, b.completed), *b.failed_tasks],
                                    [*map(_duration_of, b.completed), *b.failed_ms], b.failed_tasks)
    argv.append(len(histogram) // 2)
    if histogram:
        argv.append(_pack_items(histogram))
    argv.append(len(b.markers) // MARKER_ITEMS)
    argv += b.markers
    argv.append(b.n_skipped)
    if b.n_skipped:
        argv.append(_pack_items(b.skipped))
    argv.append(b.n_fetched)
    if b.flow_ends:
        argv += (len(b.flow_ends) // FLOW_END_ITEMS, _pack_items(b.flow_ends))
    return {"keys": [keys.stream, keys.delayed, keys.dlq, keys.events, keys.running(worker_id)], "args": argv}
