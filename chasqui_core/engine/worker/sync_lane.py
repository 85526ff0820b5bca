"""Threads that run sync handlers.

A sync handler (a plain ``def``, the Django-typical case) cannot run on the
event loop. Handing each job to a thread pool costs a Future and two thread
wake-ups per job; instead, the reader feeds sync jobs straight into an
inbox that a fixed set of threads drain, and the threads hand outcomes back
in batches: one loop wake-up carries every outcome that finished meanwhile.
The inbox keeps one line per priority band (priority.py); a queue of tokens,
one per job waiting, wakes the threads.

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

from chasqui_core.engine.jobs.envelope import check_json_types, now_ms
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.worker.delivery import Delivery
from chasqui_core.engine.jobs.priority import STRICT, Inbox

OK, FAILED, REQUEUE, LATE = 0, 1, 2, 3
"""What became of a job handed to the lane: ran (OK, FAILED), went back unstarted (REQUEUE), or came back to the
loop unstarted because its rate token lapsed while it waited (LATE: it takes one again, limits.py)."""

Outcome = tuple[int, Delivery, Any, int, int]
"""(kind, delivery, result or exception, started at ms, duration ms)."""


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
        self._queue: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        """One True per job in ``_waiting``, one None per thread to end (``close``)."""
        self._done: deque[Outcome] = deque()
        self._notified = False
        self._names = itertools.count()
        self._threads: list[threading.Thread] = []
        for _ in range(size):
            self.replace()

    def submit(self, delivery: Delivery) -> None:
        self.outstanding += 1
        self._waiting.append(delivery)
        self._queue.put(True)

    def take_unstarted(self) -> list[Delivery]:
        """Remove and return the jobs no thread has picked up yet."""
        taken: list[Delivery] = []
        while True:
            try:
                token = self._queue.get_nowait()
            except queue.Empty:
                break
            if token is not None:  # a job no thread will take now
                taken.append(self._waiting.popleft())
        self.outstanding -= len(taken)
        return taken

    def abandon(self, delivery: Delivery) -> None:
        """Stop counting a job whose run passed its timeout (its outcome was written already; on the loop)."""
        delivery.timed_out = True
        self.outstanding -= 1
        self.abandoned += 1

    def replace(self) -> None:
        """Start one more thread: at start, and in place of one stuck in a job that passed its timeout."""
        thread = threading.Thread(target=self._run, name=f"chasqui-sync-{next(self._names)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    # --- in the threads -----------------------------------------------------------

    def _run(self) -> None:
        """Take jobs and run them until told to end.

        A run's journal mark is struck the moment its handler returns, before
        its outcome is handed on (journal.py says why); when another job is
        waiting, its start mark goes out in the same send, so a busy thread
        pays one send per job, not two.
        """
        done = self._done
        journal = self.journal
        token: bool | None = self._queue.get()
        ahead: Delivery | None = None
        """The next job, taken while the last run's mark was struck, its start mark already written."""
        while True:
            if ahead is not None:
                d, ahead, marked = ahead, None, True
            elif token is None:
                return
            else:
                d, marked = self._take(), False
            if self.stopping or d.cancel_requested or d.taken_back or 0.0 < d.rate_by < time.monotonic():
                # back unstarted (cancel.py, Runner.let_go), or back to the loop for a rate token (limits.py)
                if marked:
                    journal.finished_one(d.keys.stream, d.entry_id)
                late = not (self.stopping or d.cancel_requested or d.taken_back)
                d.started = 0
                done.append((LATE if late else REQUEUE, d, None, 0, 0))
                token = self._queue.get() if not self._notify() else None
                continue
            started = now_ms()
            if not marked:
                journal.started_one(d.keys.stream, d.entry_id, started)
            outcome = self._call(d, started)
            # strike its mark at once; with the next job's start when one waits (not after an abandoned run:
            # this thread leaves the lane then)
            token = None
            if not d.timed_out:
                try:
                    token = self._queue.get_nowait()
                except queue.Empty:
                    token = False
            if token:
                ahead = self._take()
                ahead.started = now_ms()
                journal.ended_and_started(d.keys.stream, d.entry_id, ahead.keys.stream, ahead.entry_id,
                                          ahead.started)
            else:
                journal.finished_one(d.keys.stream, d.entry_id)
            done.append(outcome)
            if self._notify() or d.timed_out:  # the loop is gone, or this run was abandoned: another thread
                return                          # took this one's place
            if token is False:
                token = self._queue.get()

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

    def _take(self) -> Delivery:
        """The next job to run, for a thread that holds a token: one waits for it, though another thread
        may have taken the one this thread first looked at (then it looks again)."""
        while True:
            try:
                return self._waiting.popleft()
            except IndexError:
                time.sleep(0)

    def _call(self, d: Delivery, started: int) -> Outcome:
        """Run the handler; never raises (whatever it raises is the job's outcome)."""
        job, handler = d.job, d.handler
        d.started = started
        t0 = time.perf_counter()
        try:
            result = handler.fn(*d.handler_args(self.worker_id), **job.kwargs)
            if job.result_ttl:
                check_json_types(result, "return value")
        except BaseException as exc:  # SystemExit from a handler fails its job, not the thread
            return (FAILED, d, exc, started, int((time.perf_counter() - t0) * 1000))
        return (OK, d, result, started, int((time.perf_counter() - t0) * 1000))

    # --- on the loop ----------------------------------------------------------------

    def _drain(self) -> None:
        self._notified = False
        done = self._done
        items = []
        while done:
            items.append(done.popleft())
        for item in items:
            if not item[1].timed_out:
                self.outstanding -= 1
        if items:
            self._on_outcomes(items)
