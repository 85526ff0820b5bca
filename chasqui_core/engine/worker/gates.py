"""What stands between a fetched job and its start: its limits, a cancel request, its idempotency key.

Part of the ``Runner`` (running.py), kept apart because none of it runs for
a job of a queue without limits, cancels or idempotency keys: each is a read
the batch depends on (``_read_or_requeue``), after which the jobs that may
start go on to the runner's ``_start``. The limits' side also gives back the
concurrency slots of finished runs, a turn of the loop's worth at a time, and
takes again the rate tokens of jobs that waited past their grace (limits.py).
If Redis cannot answer a read, its jobs go back on the stream as they were:
none runs unchecked, none is lost.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.jobs.idempotency import completed_by
from chasqui_core.engine.jobs.priority import Inbox
from chasqui_core.engine.ops import cancel
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.delivery import Delivery
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.worker.limits import LimitGate
from chasqui_core.engine.recovery.journal import StartJournal

logger = logging.getLogger("chasqui.worker")


class _Unread(enum.Enum):
    UNREAD = 0


UNREAD: Final = _Unread.UNREAD
"""What ``_read_or_requeue`` returns when the read failed and its deliveries went back on the stream."""

T = TypeVar("T")

LIMIT_RETRY_S = 0.5
"""How long a reader waits after a failed limit check before reading again."""


class Gates:
    """The runner's checks before a start (a mixin of ``running.Runner``, which owns the state named here)."""

    id: str
    prefetch: int
    held: InFlight
    outcomes: Outcomes
    client: Client
    gate: LimitGate
    cancel_copies: cancel.Copies
    cancelling: set[Delivery]
    _loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event
    _room: asyncio.Event
    _inbox: Inbox
    _isolating: bool
    _alone: Delivery | None
    _releases: dict[str, list[Delivery]]
    _side_tasks: set[asyncio.Task[None]]
    _retry_hint: Callable[[str, int, int], None]
    _start: Callable[[QueueKeys, list[Delivery]], Awaitable[None]]
    _release: Callable[[Delivery], bool]
    _requeue: Callable[[Delivery], None]
    _isolate: Callable[[Delivery], None]
    _to_lane: Callable[..., None]
    _mark_alone: Callable[[Delivery], None]
    _start_round: Callable[[list[Delivery], dict[str, list[bytes]], list[Delivery]], None]
    _late: list[Delivery]
    journal: StartJournal
    _reserved: set[Delivery]
    _running: int
    _dispatch: Callable[..., None]

    @property
    def buffered(self) -> int:
        """Jobs fetched and not yet finished (the runner's)."""
        raise NotImplementedError

    async def _limit(self, keys: QueueKeys, limited: list[Delivery]) -> None:
        """Start the limited jobs whose limits have room now; the others wait in the delayed set (limits.py).

        If Redis cannot answer, the jobs go back on the stream as they were:
        none runs unchecked, none is lost.
        """
        taken = await self._read_or_requeue(keys, limited, "checking the limits", self.gate.take(keys, limited))
        if taken is UNREAD:
            await asyncio.sleep(LIMIT_RETRY_S)  # this reader only: no hot loop while the check keeps failing
            return
        if len(taken.admitted) < len(limited):
            admitted = set(taken.admitted)
            for d in limited:
                if d not in admitted:  # parked (or no longer pending here): nothing more to do with it
                    self._release(d)
        if taken.earliest_ms >= 0:
            self._retry_hint(keys.queue, taken.earliest_ms, taken.server_ms)
        await self._start(keys, taken.admitted)
        if self.buffered <= self.prefetch // 2:
            self._room.set()

    async def _read_or_requeue(self, keys: QueueKeys, deliveries: list[Delivery], doing: str,
                               read: Awaitable[T]) -> T | _Unread:
        """Await a read the batch depends on (idempotency markers, cancel requests, limit slots).

        If Redis cannot answer, the deliveries go back on the stream as they
        were, so nothing runs unchecked and nothing is lost; returns UNREAD then.
        """
        try:
            return await read
        except asyncio.CancelledError:
            for d in deliveries:
                self._requeue(d)
            raise
        except Exception as exc:
            logger.warning("%s of %d job(s) on %s failed (%s: %s); they go back on the stream", doing,
                           len(deliveries), keys.queue, type(exc).__name__, exc)
            for d in deliveries:
                self._requeue(d)
            return UNREAD

    def _retake_later(self, late: list[Delivery]) -> None:
        """Take again, off the dispatch path, the rate tokens of jobs that did not start within their grace
        (limits.py): a rate limit is a promise about starts, and a token taken at read time may have lapsed."""
        by_stream: dict[str, list[Delivery]] = {}
        for d in late:
            d.end_run()  # not started: a suspect's mark, written ahead of its start, is struck while it waits
            by_stream.setdefault(d.keys.stream, []).append(d)
        for group in by_stream.values():
            task = asyncio.ensure_future(self._retake(group[0].keys, group))
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _retake(self, keys: QueueKeys, late: list[Delivery]) -> None:
        """Start the late jobs whose rate has room now; the others wait in the delayed set, uncharged.

        An async job admitted again starts on the reply, in the worker slot it kept (``_reserved``): put back
        in the inbox, behind jobs read since, it would wait past its new grace as well, and go round again
        for as long as the worker stays busy, holding its concurrency slot all along. A sync job goes to the
        front of the lane's line, for the next thread free.
        """
        taken = await self._read_or_requeue(keys, late, "taking rate tokens again", self.gate.retake(keys, late))
        kept = [d for d in late if d in self._reserved]
        self._reserved.difference_update(kept)
        self._running -= len(kept)
        dispatch, alone = bool(kept), False  # a slot kept and not started in is filled from the inbox
        if taken is UNREAD:
            if kept:
                self._dispatch()
            return
        admitted = set(taken.admitted)
        for d in late:
            if d not in admitted:  # parked: let go, its slots given back
                self._release(d)
        if taken.earliest_ms >= 0:
            self._retry_hint(keys.queue, taken.earliest_ms, taken.server_ms)
        now: list[Delivery] = []
        for d in taken.admitted:
            if self._stop.is_set() or d.taken_back:
                self._requeue(d)
            elif d is self._alone:  # the suspect, late to run alone: it runs alone now
                if d.handler.is_async:
                    self._mark_alone(d)
                    self._inbox.append(d)
                    alone = True
                else:
                    self._to_lane(d, first=True)
            elif self._isolating:  # a suspect waits or runs alone: this one waits too
                self._isolate(d)
            elif d.handler.is_async:
                if d in kept:
                    now.append(d)
                else:
                    self._inbox.append(d)
                    dispatch = True
            else:
                self._to_lane(d, first=True)
        if now:
            self._start_now(now)
        if alone:
            self._dispatch(alone=True)
        elif dispatch:
            self._dispatch()

    def _start_now(self, batch: list[Delivery]) -> None:
        """Start these jobs at once, as one round, in worker slots kept for them (``_reserved``, given up by the
        caller just before)."""
        rounds: dict[str, list[bytes]] = {}
        for d in batch:
            if d.journal is None:
                rounds.setdefault(d.keys.stream, []).append(d.entry_id)
        if rounds:
            self.journal.dispatching(rounds)
        late = self._late
        self._start_round(batch, rounds, late)
        if late:
            self._retake_later(late)
            late.clear()

    def _give_back(self, d: Delivery) -> None:
        """Give back a run's concurrency slots soon, with the others of this turn of the loop (one call)."""
        waiting = self._releases.get(d.keys.queue)
        if waiting is None:
            self._releases[d.keys.queue] = [d]
        else:
            waiting.append(d)
        if len(self._releases) == 1 and len(self._releases[d.keys.queue]) == 1:
            self._loop.call_soon(self._send_releases)

    def _send_releases(self) -> None:
        releases, self._releases = self._releases, {}
        for deliveries in releases.values():
            self._spawn_release(deliveries[0].keys, deliveries)

    def _spawn_release(self, keys: QueueKeys, deliveries: list[Delivery]) -> None:
        async def release() -> None:
            try:
                await self.gate.release(keys, deliveries)
            except Exception as exc:  # the slots lapse by themselves after a lease
                logger.warning("giving back %d concurrency slot(s) on %s failed (%s: %s); they lapse after the "
                               "visibility timeout", len(deliveries), keys.queue, type(exc).__name__, exc)
        task = asyncio.ensure_future(release())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _unless_cancelled(self, keys: QueueKeys, admitted: list[Delivery], version: bytes) -> list[Delivery]:
        """The deliveries no cancel request names; the others are dead-lettered as cancelled without running.

        If Redis cannot answer, the jobs go back on the stream as they were: nothing runs unchecked."""
        record = await self._read_or_requeue(keys, admitted, "reading the cancel requests",
                                             self.cancel_copies.of(self.client, keys, version))
        if record is UNREAD:
            return []
        if not record:
            return admitted
        kept = []
        for d in admitted:
            requested = record.get(d.job.id)
            if requested is not None:
                self._release(d)
                self.outcomes.cancelled_unstarted(d, requested)
            else:
                kept.append(d)
        return kept

    def cancel_delivery(self, d: Delivery, requested: int) -> None:
        """Act on a cancel request for a delivery this worker holds (cancel_watch.Watch found it)."""
        if not self.held.holds(d) or d.cancel_requested:
            return
        if d.handler.is_async and not d.started and d not in self._inbox:
            return  # it waits on its idempotency key's check: the next poll finds it in the inbox or running
        d.cancel_requested = requested
        d.cancel_seen = now_ms()
        if d.handler.is_async:
            if d.started:
                if d.task is not None:
                    d.task.cancel()
            else:
                self._inbox.remove(d)
                self._release(d)
                self.outcomes.cancelled_unstarted(d, requested)
        else:  # told through its context; a thread that has not started it puts it back (sync_lane.py)
            self.cancelling.add(d)
        logger.info("worker %s: job %s (%s) cancelled %s", self.id, d.job.id, d.job.task,
                    "while it ran" if d.started else "before it started")


    async def _screen(self, keys: QueueKeys, keyed: list[Delivery]) -> None:
        """Run the keyed jobs whose key has not completed; acknowledge the others without running them.

        One MGET for the batch's markers. If Redis cannot answer, the jobs go
        back on the stream as they were (nothing runs unchecked, nothing is lost).
        """
        done = await self._read_or_requeue(keys, keyed, "checking the idempotency keys", completed_by(
            self.client, [keys.done + (d.idempotency_key or "") for d in keyed]))
        if done is UNREAD:
            return
        accepted = False
        for d, by in zip(keyed, done, strict=True):
            if d.taken_back:  # let go while its key was checked: another worker's now
                continue
            if by is not None:
                self._release(d)
                try:
                    self.outcomes.skipped(d, by)
                except Exception as exc:  # whatever goes wrong touches this job only
                    self.outcomes.internal(d, "acknowledging a job whose idempotency key had completed", exc)
            elif self._stop.is_set():  # stopping while the markers were read: it must not start now
                self._requeue(d)
            elif self._isolating or d.suspect:
                self._isolate(d)
            elif d.handler.is_async:
                self._inbox.append(d)
                accepted = True
            else:
                self._to_lane(d)
        if accepted:
            self._dispatch()

