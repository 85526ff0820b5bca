"""The promoter: moves due jobs from a queue's delayed set into its stream.

Every worker embeds one per queue; a lock elects one leader per queue
(SET NX PX, renewed and released only by its holder). The leader moves due
entries with ``promote.lua``, one call per batch, by the server's clock. It
sleeps until its poll interval or the earliest due entry, whichever is
sooner, and the local settler wakes it early when it schedules a retry.

The lock only spares Redis the work of several promoters; correctness does not
depend on it, since each move is one atomic script. That is why a follower may
also promote once, without the lock, when it has just scheduled a retry due
sooner than the leader would look.
"""

from __future__ import annotations

import asyncio
import logging
import time

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.jobs.events import EVENTS_MAXLEN
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.timing.leader import LeaderLock
from chasqui_core.engine.store.scripts import Scripts
import contextlib

logger = logging.getLogger("chasqui.promoter")

BATCH_SIZE = 200
"""Most entries one promote.lua call moves.

Redis runs one script at a time, and every other client's command waits
behind it: a worker's fetch or settle, an enqueue. A call of 200 holds the
server about half a millisecond; one of 1,000 held it two or more, and while
a large backlog came due, workers on the same server drained about 15% slower
than with nothing to promote. Bigger batches would move a backlog about a
tenth faster on an idle server (each call has a fixed cost of some 50 µs of
server time), which matters less than everyone else's latency.
"""


class Promoter:
    def __init__(
        self,
        client: Client,
        scripts: Scripts,
        keys: QueueKeys,
        holder: str,
        *,
        poll_interval: float = 0.1,
        lock_ttl_ms: int = 5000,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.holder = holder
        self.poll_interval = poll_interval
        self.lock_ttl_ms = lock_ttl_ms
        self.lock = LeaderLock(client, scripts, keys.promoter_lock, holder, lock_ttl_ms, logger=logger,
                               label=f"promoter for {keys.queue}", won_level=logging.DEBUG)
        self.batch_size = batch_size
        self.moved_total = 0
        self._wake = asyncio.Event()
        self._wake_at: float | None = None
        self._one_shots: set[asyncio.Task[None]] = set()

    def hint(self, due_ms: int, server_now_ms: int) -> None:
        """A job was scheduled to be due at ``due_ms`` (server clock): look then."""
        delay = max(0.0, (due_ms - server_now_ms) / 1000)
        if self.is_leader:
            at = time.monotonic() + delay
            if self._wake_at is None or at < self._wake_at:
                self._wake_at = at
                self._wake.set()
        elif delay < self.poll_interval * 5:
            asyncio.get_running_loop().call_later(delay, self._spawn_promote_once)

    def _spawn_promote_once(self) -> None:
        task = asyncio.ensure_future(self._promote_once())
        self._one_shots.add(task)  # keep a reference until it is done
        task.add_done_callback(self._one_shots.discard)

    async def _promote_once(self) -> None:
        try:
            await self.promote(locked=False)
        except Exception:
            logger.exception("promotion on %s failed", self.keys.queue)

    async def promote(self, locked: bool = True) -> tuple[int, int, int, bool]:
        moved, next_due, now, ok = await self.scripts.promote(
            keys=[self.keys.delayed, self.keys.stream, self.keys.events, self.keys.promoter_lock],
            args=[self.holder if locked else "", self.batch_size, self.keys.metrics, EVENTS_MAXLEN],
        )
        self.moved_total += moved
        return moved, next_due, now, ok == 1

    async def _drain(self) -> tuple[int, int, int, bool]:
        """Promote batch after batch, two calls in flight, until one comes back short.

        With one call at a time Redis idles while each reply travels back and
        the next call is sent; with two, the next batch is already queued
        when one finishes. Each call is atomic and checks the lock, so a call
        sent after the backlog ran out just moves nothing.
        """
        loop = asyncio.get_running_loop()
        calls = [loop.create_task(self.promote()), loop.create_task(self.promote())]
        try:
            while True:
                result = await calls.pop(0)
                if result[0] < self.batch_size or not result[3]:
                    await asyncio.gather(*calls, return_exceptions=True)
                    return result
                await self.lock.acquire_or_renew()  # a long drain must not outlive the lock
                if not self.is_leader:
                    return result[0], result[1], result[2], False
                calls.append(loop.create_task(self.promote()))
        finally:
            for call in calls:
                call.cancel()

    @property
    def is_leader(self) -> bool:
        return self.lock.held

    @is_leader.setter
    def is_leader(self, value: bool) -> None:
        self.lock.held = value  # promote.lua found the lock gone: stop leading at once

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sleep = min(self.lock_ttl_ms / 5000, 1.0)
            try:
                await self.lock.acquire_or_renew()
                if self.is_leader:
                    moved, next_due, now, ok = await self.promote()
                    if not ok:
                        self.is_leader = False
                        continue
                    if moved >= self.batch_size:  # a backlog: drain it, then look again
                        moved, next_due, now, ok = await self._drain()
                        if not ok:
                            self.is_leader = False
                        continue
                    # never past a third of the lock's life, so the lock is renewed in time
                    sleep = min(self.poll_interval, self.lock_ttl_ms / 3000)
                    if next_due >= 0:
                        sleep = min(sleep, max(0.0, (next_due - now) / 1000))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("promoter for %s: %s", self.keys.queue, exc)
                sleep = 1.0
            await self._nap(sleep)
        await self.release()

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when a hint asks to look sooner.

        A hint can only bring the wake-up forward. One due later than the
        planned wake-up is left to a later round: sleeping until it would leave
        every other due job, and the lock's renewal, waiting as long.
        """
        wake_at = time.monotonic() + seconds
        if self._wake_at is not None:  # hinted while promoting
            wake_at = min(wake_at, self._wake_at)
        self._wake_at = wake_at
        try:
            while (remaining := self._wake_at - time.monotonic()) > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=remaining)
        finally:
            self._wake_at = None

    async def release(self) -> None:
        await self.lock.release()
