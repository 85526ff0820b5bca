"""A worker's part that acts on cancel requests for the jobs it holds, and writes their progress reports.

The requests themselves, and how a worker checks them at pickup, are
cancel.py's; this is the "while held" half: ``Watch`` polls the queues'
cancel records every ``POLL_S`` for the jobs the worker holds and tells the
runner (``Cancellable``) to act on each one named there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from chasqui_core.engine.jobs import progress
from chasqui_core.engine.ops.cancel import DEFAULT_GRACE_S, KEEP_MS, POLL_S, SWEEP_EVERY_S, describe
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.worker.delivery import Delivery
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.jobs.errors import JobCancelled
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.settle.settler import Settler

logger = logging.getLogger("chasqui.worker")


class Cancellable(Protocol):
    """What the watch asks of the part that runs jobs (running.Runner is one)."""

    cancelling: set[Delivery]

    def cancel_delivery(self, d: Delivery, requested: int) -> None: ...

    def abandon_sync(self, d: Delivery, exc: BaseException, now: int, what: str) -> None: ...


class Watch:
    """A worker's part that acts on cancel requests for the jobs it holds, and writes their progress reports."""

    def __init__(self, worker_id: str, client: Client, keys: list[QueueKeys], held: InFlight, outcomes: Outcomes,
                 settler: Settler, runner: Cancellable, grace: float = DEFAULT_GRACE_S) -> None:
        self.id = worker_id
        self.client = client
        self.keys = keys
        self.held = held
        self.outcomes = outcomes
        self.settler = settler
        self.runner = runner
        self.grace = grace
        self._to_strike: dict[QueueKeys, list[str]] = {}
        """Requests of settled cancelled jobs whose strike failed (Redis away): struck at the next poll."""
        self._last_sweep = time.monotonic()

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(POLL_S)
                if (len(self.held) or self.outcomes.cancelled or self._to_strike or self.runner.cancelling
                        or progress.waiting(self.id)):
                    await self.poll()
                if time.monotonic() - self._last_sweep >= SWEEP_EVERY_S:
                    self._last_sweep = time.monotonic()
                    await self.sweep()
        finally:
            progress.forget(self.id)

    async def poll(self) -> None:
        """One round trip: the requests for the jobs held, the cleanup of settled ones, the progress reports."""
        pipe = self.client.pipeline(transaction=False)
        asked: list[tuple[QueueKeys, list[Delivery]]] = []
        by_queue: dict[str, list[Delivery]] = {}
        for d in self.held:
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
        reports = progress.take(self.id)
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
                self._to_strike.setdefault(keys, []).extend(job_ids)
            logger.warning("worker %s: reading cancel requests failed (%s: %s)", self.id, type(exc).__name__, exc)
            self._expire_grace()
            return
        for (_, deliveries), found in zip(asked, replies[:len(asked)], strict=True):
            for d, raw in zip(deliveries, found, strict=True):
                if raw is not None:
                    self.runner.cancel_delivery(d, int(raw))
        self._expire_grace()

    def _settled_cancels(self) -> dict[QueueKeys, list[str]]:
        """Job ids of cancelled jobs whose outcome has been written: their requests can go."""
        out, self._to_strike = self._to_strike, {}
        pending = self.outcomes.cancelled
        if not pending:
            return out
        waiting: dict[str, set[bytes]] = {}
        keep: list[tuple[QueueKeys, bytes, str]] = []
        for keys, entry_id, job_id in pending:
            unsettled = waiting.get(keys.stream)
            if unsettled is None:
                unsettled = waiting[keys.stream] = set(self.settler.unsettled(keys))
            if entry_id in unsettled:
                keep.append((keys, entry_id, job_id))
            else:
                out.setdefault(keys, []).append(job_id)
        self.outcomes.cancelled = keep
        return out

    def _expire_grace(self) -> None:
        """Give up the sync runs told to stop more than ``grace`` seconds ago."""
        cancelling = self.runner.cancelling
        if not cancelling:
            return
        now = now_ms()
        for d in list(cancelling):
            if not self.held.holds(d):
                cancelling.discard(d)
            elif d.started and now - max(d.started, d.cancel_seen) >= self.grace * 1000:
                cancelling.discard(d)
                self.runner.abandon_sync(d, JobCancelled(describe(d.cancel_requested, running=True)), now,
                                         f"sync job {d.job.id} ({d.job.task}) was cancelled and still ran "
                                         f"{self.grace:g} s after it was told")

    async def sweep(self) -> None:
        """Drop requests older than ``KEEP_MS`` from this worker's queues' records."""
        cutoff = now_ms() - KEEP_MS
        for keys in self.keys:
            try:
                records: dict[Any, Any] = await self.client.hgetall(keys.cancel)
                old = [job_id for job_id, at in records.items() if int(at) < cutoff]
                if old:
                    pipe = self.client.pipeline(transaction=False)
                    pipe.hdel(keys.cancel, *old)
                    pipe.incr(keys.cancel_version)
                    await pipe.execute()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("worker %s: sweeping old cancel requests on %s failed (%s: %s)", self.id,
                               keys.queue, type(exc).__name__, exc)
