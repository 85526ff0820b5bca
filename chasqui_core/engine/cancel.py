"""Cancelling a job by id, wherever it is: waiting, delayed or running.

A cancel request is a field of the queue's cancel record
(``{chasqui:<q>}:cancel``, a hash job id -> requested ms), written by
``request`` with ``cancel.lua``. A delayed job found in the delayed set is
moved to the stream in the same call, so it is settled at once rather than at
its due time. Workers act on the record in two places:

- **At pickup.** Each XREADGROUP is sent with a ``GET`` of the record's
  version (``{chasqui:<q>}:cancel:v``, bumped by every change to the record)
  in the same round trip (reader.py): the server runs it right after the
  read, so a request written before an entry was delivered is seen. The
  worker keeps a copy of the record per version (``Copies``) and checks the
  batch's job ids against it in memory; only a new version costs a read of
  the record. A job named there is not run. A queue nobody cancels in pays
  one tiny command per batch read, and a record that stays non-empty one
  dict lookup per job.
- **While held.** ``Watch`` polls the record every ``POLL_S`` for the jobs
  the worker holds (one ``HMGET`` per queue, pipelined, and only while it
  holds any). A job still waiting in the worker is settled without running;
  a running async job is cancelled (``asyncio.Task.cancel``); a running sync
  job is told (``JobContext.cancelled``), and once ``grace`` seconds have
  passed it is given up like a job past its timeout: its outcome is written
  and its thread abandoned (or the process recycled, under a supervisor).

A cancelled job is dead-lettered with reason ``cancelled`` (not counted as a
failure, never retried; its stored result says FAILED with a
``JobCancelled`` error), where it can be looked at, replayed or discarded,
as Oban keeps a cancelled job and Celery a revoked one. A run that finishes
despite the request (it returned before the worker acted, or a sync job
that ignored the flag and returned within the grace) keeps its success.

Once a cancelled job's outcome is written, the watch removes its field from
the record. Fields whose job never came (it had finished already) are swept
after ``KEEP_MS``; see docs/flow-control.md for what that bounds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import progress
from .connection import Client
from .envelope import now_ms
from .errors import JobCancelled
from .keys import QueueKeys
from .scripts import Scripts

if TYPE_CHECKING:
    from .outcomes import Delivery
    from .worker import Worker

logger = logging.getLogger("chasqui.worker")

POLL_S = 0.5
"""How often a worker holding jobs reads the cancel records (and writes the progress its jobs reported)."""

DEFAULT_GRACE_S = 10.0
"""How long a running sync job, once told, may go on before it is given up like a job past its timeout."""

KEEP_MS = 7 * 24 * 3600 * 1000
"""A request no worker acted on (its job had finished, say) is swept this long after it was made."""

SWEEP_EVERY_S = 300.0
"""How often each worker sweeps old requests out of its queues' records."""


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """What a cancel call did."""

    job_id: str
    queue: str
    requested_ms: int
    """Server time of the request."""
    moved_from_delayed: bool
    """The job was in the delayed set and went to the stream, to be settled as cancelled by the next worker."""


def request(client: Client, queue: str, job_id: str, delayed_member: bytes | None = None) -> CancelRequest:
    """Ask for ``job_id`` on ``queue`` to be cancelled; ``delayed_member``: its member in the delayed set, when
    it was found there (delayed.find), so that it leaves the set at once. Safe to repeat."""
    keys = QueueKeys.for_queue(queue)
    now, how = Scripts(client).cancel(keys=[keys.cancel, keys.delayed, keys.stream, keys.cancel_version],
                                      args=[job_id, delayed_member or b""])
    moved = (how.decode() if isinstance(how, bytes) else str(how)) == "delayed"
    return CancelRequest(job_id, queue, int(now), moved)


def requested_ms(client: Client, queue: str, job_id: str) -> int | None:
    """When a cancel of the job was asked for, while its request is on record; None otherwise."""
    raw = client.hget(QueueKeys.for_queue(queue).cancel, job_id)
    return int(raw) if raw is not None else None


UNKNOWN = b"?"
"""The version to pass ``Copies.of`` when it was not read with the entries: the record is read afresh."""


class Copies:
    """A worker's copies of its queues' cancel records, one per record version.

    The reader reads the record's version with every XREADGROUP (in the same
    round trip); while it is the one copied, the batch is checked against the
    copy in memory, and only a new version costs a read of the record. A
    version of None means no request was ever made on the queue.
    """

    def __init__(self) -> None:
        self._copies: dict[str, tuple[bytes, dict[str, int]]] = {}

    async def of(self, client: Client, keys: QueueKeys, version: bytes) -> dict[str, int]:
        """The record (job id -> requested ms) as of ``version`` or later."""
        copy = self._copies.get(keys.queue)
        if copy is not None and copy[0] == version and version is not UNKNOWN:
            return copy[1]
        raw = await client.hgetall(keys.cancel)
        record = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
        if version is not UNKNOWN:
            self._copies[keys.queue] = (version, record)
        return record


def describe(requested: int, *, running: bool) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(requested / 1000))
    return f"cancelled {'while it ran' if running else 'before it started'} (requested at {when} UTC)"


class Watch:
    """A worker's part that acts on cancel requests for the jobs it holds, and writes their progress reports."""

    def __init__(self, worker: Worker, grace: float = DEFAULT_GRACE_S) -> None:
        self.w = worker
        self.grace = grace
        self.cancelling: set[Delivery] = set()
        """Sync deliveries told to stop, until their outcome or their grace runs out."""
        self._last_sweep = time.monotonic()

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(POLL_S)
                w = self.w
                if len(w.held) or w.outcomes.cancelled or self.cancelling or progress.waiting(w.id):
                    await self.poll()
                if time.monotonic() - self._last_sweep >= SWEEP_EVERY_S:
                    self._last_sweep = time.monotonic()
                    await self.sweep()
        finally:
            progress.forget(self.w.id)

    async def poll(self) -> None:
        """One round trip: the requests for the jobs held, the cleanup of settled ones, the progress reports."""
        w = self.w
        pipe = w.client.pipeline(transaction=False)
        asked: list[tuple[QueueKeys, list[Delivery]]] = []
        by_queue: dict[str, list[Delivery]] = {}
        for d in w.held:
            if not d.cancel_requested:
                by_queue.setdefault(d.keys.queue, []).append(d)
        for deliveries in by_queue.values():
            keys = deliveries[0].keys
            pipe.hmget(keys.cancel, [d.job.id for d in deliveries])
            asked.append((keys, deliveries))
        cleanup = self._settled_cancels()
        for keys, job_ids in cleanup.items():
            pipe.hdel(keys.cancel, *job_ids)
            pipe.incr(keys.cancel_version)  # the readers' copies must forget them: a replay may run
        reports = progress.take(w.id)
        for (queue, job_id), (value, message, at) in reports.items():
            pipe.set(QueueKeys.for_queue(queue).progress + job_id, progress.encode(value, message, at),
                     px=progress.TTL_MS)
        if not len(pipe):
            self._expire_grace()
            return
        try:
            replies = await pipe.execute()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis away: the settled ones are struck next time, reports are dropped
            for keys, job_ids in cleanup.items():
                w.outcomes.cancelled.extend((keys, b"", job_id) for job_id in job_ids)
            logger.warning("worker %s: reading cancel requests failed (%s: %s)", w.id, type(exc).__name__, exc)
            self._expire_grace()
            return
        for (_, deliveries), found in zip(asked, replies[:len(asked)], strict=True):
            for d, raw in zip(deliveries, found, strict=True):
                if raw is not None:
                    w.cancel_delivery(d, int(raw))
        self._expire_grace()

    def _settled_cancels(self) -> dict[QueueKeys, list[str]]:
        """Job ids of cancelled jobs whose outcome has been written: their requests can go."""
        w = self.w
        pending = w.outcomes.cancelled
        if not pending:
            return {}
        waiting: dict[str, set[bytes]] = {}
        keep: list[tuple[QueueKeys, bytes, str]] = []
        out: dict[QueueKeys, list[str]] = {}
        for keys, entry_id, job_id in pending:
            unsettled = waiting.get(keys.stream)
            if unsettled is None:
                unsettled = waiting[keys.stream] = set(w.settler.unsettled(keys))
            if entry_id in unsettled:
                keep.append((keys, entry_id, job_id))
            else:
                out.setdefault(keys, []).append(job_id)
        w.outcomes.cancelled = keep
        return out

    def _expire_grace(self) -> None:
        """Give up the sync runs told to stop more than ``grace`` seconds ago."""
        if not self.cancelling:
            return
        w = self.w
        now = now_ms()
        for d in list(self.cancelling):
            if d.tag not in w.held.by_tag:
                self.cancelling.discard(d)
            elif d.started and now - max(d.started, d.cancel_seen) >= self.grace * 1000:
                self.cancelling.discard(d)
                w.abandon_sync(d, JobCancelled(describe(d.cancel_requested, running=True)), now,
                               f"sync job {d.job.id} ({d.job.task}) was cancelled and still ran {self.grace:g} s "
                               "after it was told")

    async def sweep(self) -> None:
        """Drop requests older than ``KEEP_MS`` from this worker's queues' records."""
        w = self.w
        cutoff = now_ms() - KEEP_MS
        for keys in w.keys:
            try:
                records: dict[Any, Any] = await w.client.hgetall(keys.cancel)
                old = [job_id for job_id, at in records.items() if int(at) < cutoff]
                if old:
                    pipe = w.client.pipeline(transaction=False)
                    pipe.hdel(keys.cancel, *old)
                    pipe.incr(keys.cancel_version)
                    await pipe.execute()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("worker %s: sweeping old cancel requests on %s failed (%s: %s)", w.id, keys.queue,
                               type(exc).__name__, exc)
