"""Suspects run alone: a job charged a run lost with a worker that died runs with nothing beside it.

Part of the ``Runner`` (running.py), kept apart because it is a mode the
runner enters only after a crash, and nothing of it runs otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.jobs.priority import Inbox
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.worker.delivery import Delivery
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.worker.sync_lane import SyncLane

logger = logging.getLogger("chasqui.worker")


class Suspects:
    """The runner's isolation of suspects (a mixin of ``running.Runner``, which owns the state named here)."""

    id: str
    held: InFlight
    journal: StartJournal
    _loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event
    _inbox: Inbox
    _lane: SyncLane | None
    _isolating: bool
    _suspects: deque[Delivery]
    _room: asyncio.Event
    _alone: Delivery | None
    _to_lane: Callable[[Delivery], None]
    _requeue: Callable[[Delivery], None]
    _dispatch: Callable[..., None]

    @property
    def in_flight(self) -> int:
        """Jobs running now (the runner's)."""
        raise NotImplementedError

    def _isolate(self, d: Delivery) -> None:
        """Keep a suspect to run alone, and give every other job back while one is kept.

        A job that kills its process takes with it every job running beside it, and each of those is charged a
        lost run. Run beside the same neighbours again, it would kill them a second time, and two deaths make
        a ``panic``: innocent jobs dead-lettered beside the pill. So a suspect runs with nothing else running in
        its process; if it dies then, the death is its own. The jobs fetched with it go back on the stream,
        uncharged, for the other worker processes to run meanwhile, and this one reads nothing more until its
        suspects have run (``Runner.room_to_read``): held here, behind suspects run one at a time, they would wait
        for all of them (under a crash storm on a loaded host the soak saw a queue stop draining that way)."""
        if not self._isolating:
            self._isolating = True
            waiting = [*self._inbox, *(self._lane.take_unstarted() if self._lane is not None else ())]
            self._inbox.clear()
            for other in waiting:
                self._isolate_one(other)
        self._isolate_one(d)
        self._loop.call_soon(self._run_alone)

    def _isolate_one(self, d: Delivery) -> None:
        if d.suspect:
            self._suspects.append(d)
        else:
            self._requeue(d)

    def _mark_alone(self, d: Delivery) -> None:
        """Mark an async suspect running just before it starts alone, unlike other async jobs (running._dispatch):
        nothing runs beside it to take the blame, and a job that kills its process before its first await is
        charged a death. Struck should it not start after all (its rate token lapsed: gates._retake_later)."""
        d.journal = self.journal
        self.journal.started_one(d.keys.stream, d.entry_id, now_ms())

    def _run_alone(self) -> None:
        """Start the next suspect once nothing runs in this process; when none is left, read again. Called whenever
        a run ends while isolating."""
        if self._alone is not None or not self._isolating or self._stop.is_set() or self.in_flight:
            return
        while self._suspects:
            d = self._suspects.popleft()
            if d.taken_back or not self.held.holds(d):
                continue
            self._alone = d
            logger.info("worker %s: job %s (%s) runs alone: it was running, or about to start, when a worker died "
                        "(%d death(s) charged); alone, a death of its process is its own", self.id, d.job.id,
                        d.job.task, d.job.deaths)
            if d.handler.is_async:
                self._mark_alone(d)
                self._inbox.append(d)
                self._dispatch(alone=True)
            else:
                self._to_lane(d)
            return
        self._isolating = False
        self._room.set()  # the reader takes jobs again

