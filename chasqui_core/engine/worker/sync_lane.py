"""Threads that run sync handlers.

A sync handler (a plain ``def``, the Django-typical case) cannot run on the
event loop, so the reader feeds sync jobs into an inbox (one line per
priority band, priority.py) that a fixed set of threads take from, and the
threads hand outcomes back in batches: one loop wake-up carries every outcome
that finished meanwhile.

Throughput comes from waking few threads, not many. A noop job takes a few
µs of the GIL; waking a thread for it (a token, a futex, the GIL handed over
from the loop) costs more than the job, and with a hundred threads each
woken per job a sync worker ran at a quarter of an async one. So a woken
thread keeps taking jobs from the inbox until it is empty, and the loop wakes
a thread only when none is awake (``submit_many``). Threads are added as the jobs
need them: while jobs wait, the loop looks every ``SPREAD_S``, and if a job
waiting at the last look still waits and the awake threads took only a few
jobs each meanwhile (they are busy in slower jobs: a query, a call to another
service), it wakes as many again as are awake. So quick jobs run on one or
two threads with no hand-over per job, even a backlog of them, and slower
ones spread over the whole lane within a few milliseconds.

A thread writes its job to the start journal (journal.py) just before the
handler starts, so a crash charges the jobs that were running and none of
those still queued. A job that passes its timeout cannot be stopped: the
worker writes its outcome (``abandon``), and the thread running it leaves the
lane once the handler returns, if it ever does; ``replace`` starts another
in its place.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from chasqui_core.engine.jobs.envelope import check_json_types
from chasqui_core.engine.jobs.priority import STRICT, Inbox
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.worker.delivery import Delivery
from chasqui_core.engine.worker.limits import LimitGate

OK, FAILED, REQUEUE, LATE = 0, 1, 2, 3
"""What became of a job handed to the lane: ran (OK, FAILED), went back unstarted (REQUEUE), or came back to the
loop unstarted because its rate token lapsed while it waited (LATE: it takes one again, limits.py)."""

Outcome = tuple[int, Delivery, Any, int, int]
"""(kind, delivery, result or exception, started at ms, duration ms)."""

SPREAD_S = 0.001
"""How long jobs may wait with no thread taking one before the loop wakes more threads."""
NOTIFY_AT = 256
"""Outcomes a busy thread lets wait for the loop's look before it wakes the loop itself."""
QUICK_PER_LOOK = 4
"""Jobs an awake thread takes in one look (``SPREAD_S``) when they are quick: a quarter of a millisecond each or
less. Such jobs mostly hold the GIL, so more threads would only take it from each other (every hand-over a futex
and a context switch: a backlog of noop Django tasks cost three times the CPU when the whole lane woke for it);
slower ones wait on something (a query), and more threads run more of them at once."""


class SyncLane:
    def __init__(self, size: int, worker_id: str, on_outcomes: Callable[[list[Outcome]], None],
                 journal: StartJournal, priority_mode: str = STRICT) -> None:
        self.worker_id = worker_id
        self.journal = journal
        self.outstanding = 0
        """Jobs handed to the lane and not yet reported back nor abandoned (updated on the loop only)."""
        self.stopping = False
        self.abandoned = 0
        """Runs given up at their timeout, whose threads may still be stuck in them."""
        self._loop = asyncio.get_running_loop()
        self._on_outcomes = on_outcomes
        self._waiting = Inbox(priority_mode)
        self._asleep: deque[queue.SimpleQueue[bool | None]] = deque()
        """The wake-up queues of the threads asleep (True: take jobs again; None: end). A thread puts its own
        here, and the loop takes one out to wake it: appends and pops of a deque are atomic, so no lock is
        taken, by the loop or a thread."""
        self._wakers: list[queue.SimpleQueue[bool | None]] = []
        self._size = 0
        """Threads in the lane (not counting those abandoned in a run past its timeout; on the loop only)."""
        self._taken = 0
        """Jobs taken by the threads so far (a hint for ``_spread``: a lost update only delays a wake-up)."""
        self._spreading: asyncio.TimerHandle | None = None
        self._seen = -1
        """``_taken`` at the last look (``_spread``)."""
        self._seen_waiting = 0
        """Jobs waiting at the last look."""
        self._done: deque[Outcome] = deque()
        self._notified = False
        self._names = itertools.count()
        self._threads: list[threading.Thread] = []
        for _ in range(size):
            self.replace()

    def submit_many(self, deliveries: list[Delivery], first: bool = False) -> None:
        """Hand jobs to the threads (on the loop), a read's at once: all are in the inbox before a thread is woken,
        the lane's checks are made once for the lot, and a thread is woken only when none is awake. ``first``:
        ahead of the jobs of their band already waiting."""
        self.outstanding += len(deliveries)
        lines = self._waiting.lines
        if first:
            for d in deliveries:
                lines[d.keys.rank].appendleft(d)
        else:
            for d in deliveries:
                lines[d.keys.rank].append(d)
        if len(self._asleep) >= self._size:  # none awake (a thread going to sleep says so first, then looks at
            self._wake_up(1)                   # the inbox again: one of the two sees the other)
        if self._spreading is None:
            self._seen = self._taken
            self._seen_waiting = len(self._waiting)
            self._spreading = self._loop.call_later(SPREAD_S, self._spread)

    def _wake_up(self, wanted: int) -> None:
        asleep = self._asleep
        for _ in range(wanted):
            try:
                waker = asleep.pop()
            except IndexError:
                return
            waker.put(True)

    def _spread(self) -> None:
        """While jobs wait: if the threads took fewer jobs since the last look than were waiting then, a job has
        waited a whole look; when the awake threads also took fewer than ``QUICK_PER_LOOK`` each, they are busy in
        slower jobs (a query, a call to another service), so wake as many again (at most one per job waiting):
        such a lane is all awake within a few looks. Quick jobs wake nobody, even a backlog of them: one thread
        takes them about as fast as many would."""
        self._spreading = None
        if self._done and not self._notified:  # outcomes a busy thread left for this look (``_run``)
            self._drain()
        waiting = len(self._waiting)
        if not waiting:
            return
        taken = self._taken
        awake = max(1, self._size - len(self._asleep))
        if taken - self._seen < min(self._seen_waiting, awake * QUICK_PER_LOOK):
            self._wake_up(min(waiting, awake))
        self._seen = taken
        self._seen_waiting = waiting
        self._spreading = self._loop.call_later(SPREAD_S, self._spread)

    def take_unstarted(self) -> list[Delivery]:
        """Remove and return the jobs no thread has picked up yet."""
        taken: list[Delivery] = []
        while True:
            try:
                taken.append(self._waiting.popleft())
            except IndexError:
                break
        self.outstanding -= len(taken)
        return taken

    def abandon(self, delivery: Delivery) -> None:
        """Stop counting a job whose run passed its timeout (its outcome was written already; on the loop).
        Its thread is counted out of the lane: it leaves once the handler returns."""
        delivery.timed_out = True
        self.outstanding -= 1
        self.abandoned += 1
        self._size -= 1

    def replace(self) -> None:
        """Start one more thread: at start, and in place of one stuck in a job that passed its timeout."""
        self._size += 1
        waker: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self._wakers.append(waker)
        thread = threading.Thread(target=self._run, args=(waker,), name=f"chasqui-sync-{next(self._names)}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()
        if self._waiting:
            self._wake_up(1)

    def close(self) -> None:
        if self._spreading is not None:
            self._spreading.cancel()
            self._spreading = None
        for waker in self._wakers:
            waker.put(None)

    # --- in the threads -----------------------------------------------------------

    def _sleep(self, waker: queue.SimpleQueue[bool | None]) -> bool:
        """Go to sleep unless a job waits; False when the thread is to end.

        The thread says it is asleep first and looks at the inbox after: a job
        the loop added before it looked is seen here, and one added after
        finds no thread awake and wakes one (``submit_many``). A thread that finds
        a job but was taken out to be woken meanwhile takes its wake-up too."""
        self._asleep.append(waker)
        if self._waiting:
            try:
                self._asleep.remove(waker)
            except ValueError:  # being woken: its token is on the way
                return waker.get() is not None
            return True
        return waker.get() is not None

    def _run(self, waker: queue.SimpleQueue[bool | None]) -> None:
        """Take jobs and run them until told to end.

        A run's journal mark is struck the moment its handler returns, before
        its outcome is handed on (journal.py says why); when another job is
        waiting, its start mark goes out in the same send, so a busy thread
        pays one send per job, not two. The run itself is written out here
        rather than in a method of its own: this loop is the whole of a sync
        job's time in its thread, and each call it makes per job is a
        measurable share of a noop job.
        """
        done = self._done
        append = done.append
        journal = self.journal
        popleft = self._waiting.popleft
        worker_id = self.worker_id
        clock, wall = time.perf_counter, time.time
        ahead: Delivery | None = None
        """The next job, taken while the last run's mark was struck, its start mark already written."""
        while True:
            if ahead is not None:
                d, ahead = ahead, None
                started = d.started
            else:
                try:
                    d = popleft()
                except IndexError:
                    if not self._sleep(waker):
                        return
                    continue
                started = 0
            self._taken += 1
            back = self.stopping or d.cancel_requested or d.taken_back
            if not (back or started):
                d.started = started = int(wall() * 1000)
                journal.started_one(d.keys.stream, d.entry_id, started)
            if back or (d.limits and LimitGate.late(d)):
                # back unstarted (cancel.py, Runner.let_go), or back to the loop for a rate token (limits.py),
                # checked once its start mark is sent: whatever the send took counts against the token's grace
                if started:
                    d.journal = journal
                    d.end_run()
                d.started = 0
                append((REQUEUE if back else LATE, d, None, 0, 0))
                if self._notify():
                    return
                continue
            d.journal = journal
            job = d.job
            t0 = clock()
            try:  # the handler: never raises out of here (whatever it raises is the job's outcome)
                result = d.handler.fn(*d.handler_args(worker_id), **job.kwargs)
                if job.result_ttl:
                    check_json_types(result, "return value")
            except BaseException as exc:  # SystemExit from a handler fails its job, not the thread
                outcome: Outcome = (FAILED, d, exc, started, int((clock() - t0) * 1000))
            else:
                outcome = (OK, d, result, started, int((clock() - t0) * 1000))
            if d.timed_out:  # abandoned: its outcome is written, and this thread is out of the lane
                d.end_run()
                append(outcome)
                self._notify()
                return
            # strike its mark at once (unless the task's wrapper did), with the next job's start when one waits
            try:
                ahead = popleft()
            except IndexError:
                d.end_run()
            else:
                ahead.started = now = int(wall() * 1000)
                if d.journal is not None:  # not struck yet (a start that went back to the loop struck its own)
                    d.journal = None
                    journal.ended_and_started(d.keys.stream, d.entry_id, ahead.keys.stream, ahead.entry_id, now,
                                              d.end_noted)
                else:
                    journal.started_one(ahead.keys.stream, ahead.entry_id, now)
            append(outcome)
            # Wake the loop for its outcomes only when this thread has no next job, took the last one waiting, or
            # holds many: otherwise the loop's look (``_spread``, every SPREAD_S while jobs wait) takes them. A
            # loop woken per outcome waits for the GIL, and takes it at the thread's next send (which lets go of
            # it): a hand-over, a futex and a context switch per job, a third of a noop sync job's CPU.
            if (not self._notified and (ahead is None or not self._waiting or len(done) >= NOTIFY_AT)
                    and self._notify()):  # the loop is gone (an abandoned run ending late)
                return

    def _notify(self) -> bool:
        """Wake the loop to drain the outcomes (once for all that finished meanwhile); True when it is gone.

        Append first, then look at the flag: the loop clears the flag before
        it drains, so an outcome is never left behind."""
        if not self._notified:
            self._notified = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: the worker is gone (an abandoned run ending late)
                return True
        return False

    # --- on the loop ----------------------------------------------------------------

    def _drain(self) -> None:
        self._notified = False
        done = self._done
        popleft = done.popleft
        items = [popleft() for _ in range(len(done))]  # only the loop takes out: what was counted is there
        if items:
            self.outstanding -= len(items) - sum([1 for item in items if item[1].timed_out])
            self._on_outcomes(items)
