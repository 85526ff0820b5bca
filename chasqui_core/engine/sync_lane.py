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

from .envelope import check_json_types, now_ms
from .journal import StartJournal
from .delivery import Delivery
from .priority import STRICT, Inbox

OK, FAILED, REQUEUE = 0, 1, 2

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
        done = self._done
        while True:
            if self._queue.get() is None:
                return
            d = self._take()
            if self.stopping or d.cancel_requested or d.taken_back:  # back unstarted (cancel.py, Runner.let_go)
                done.append((REQUEUE, d, None, 0, 0))
            else:
                try:
                    done.append(self._call(d))
                except BaseException as exc:  # never lose the thread, nor the job's outcome
                    done.append((FAILED, d, exc, now_ms(), 0))
            # append first, then look at the flag: the loop clears the flag
            # before it drains, so an outcome is never left behind
            if not self._notified:
                self._notified = True
                try:
                    self._loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed: the worker is gone (an abandoned run ending late)
                    return
            if d.timed_out:  # abandoned while it ran: another thread took this one's place
                return

    def _take(self) -> Delivery:
        """The next job to run, for a thread that holds a token: one waits for it, though another thread
        may have taken the one this thread first looked at (then it looks again)."""
        while True:
            try:
                return self._waiting.popleft()
            except IndexError:
                time.sleep(0)

    def _call(self, d: Delivery) -> Outcome:
        job, handler = d.job, d.handler
        started = now_ms()
        self.journal.started_one(d.keys.stream, d.entry_id, started)
        d.journaled = True
        d.started = started
        t0 = time.perf_counter()
        try:
            result = handler.fn(*d.handler_args(self.worker_id), **job.kwargs)
        except BaseException as exc:  # SystemExit from a handler fails its job, not the thread
            self._ended(d)
            return (FAILED, d, exc, started, int((time.perf_counter() - t0) * 1000))
        self._ended(d)
        if job.result_ttl:
            try:
                check_json_types(result, "return value")
            except BaseException as exc:
                return (FAILED, d, exc, started, int((time.perf_counter() - t0) * 1000))
        return (OK, d, result, started, int((time.perf_counter() - t0) * 1000))

    def _ended(self, d: Delivery) -> None:
        """Strike the run's journal mark before anything else happens in this thread (journal.py says why)."""
        self.journal.finished_one(d.keys.stream, d.entry_id)
        d.journaled = False

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
