"""Threads that run sync handlers.

A sync handler (a plain ``def``, the Django-typical case) cannot run on the
event loop. Handing each job to a thread pool costs a Future and two thread
wake-ups per job; instead, the reader feeds sync jobs straight into a queue
that a fixed set of threads drain, and the threads hand outcomes back in
batches: one loop wake-up carries every outcome that finished meanwhile.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .envelope import check_json_types, now_ms
from .outcomes import Delivery

OK, FAILED, REQUEUE = 0, 1, 2

Outcome = tuple[int, Delivery, Any, int, int]
"""(kind, delivery, result or exception, started at ms, duration ms)."""


class SyncLane:
    def __init__(self, size: int, worker_id: str, on_outcomes: Callable[[list[Outcome]], None],
                 running: dict[bytes, tuple[str, str, int]]) -> None:
        self.worker_id = worker_id
        self.running = running
        """The worker's record of jobs running now (entry id -> task, job id, started at ms), for its heartbeat."""
        self.outstanding = 0
        """Jobs handed to the lane and not yet reported back (updated on the loop only)."""
        self.stopping = False
        self._loop = asyncio.get_running_loop()
        self._on_outcomes = on_outcomes
        self._queue: queue.SimpleQueue[Delivery | None] = queue.SimpleQueue()
        self._done: deque[Outcome] = deque()
        self._notified = False
        self._threads = [
            threading.Thread(target=self._run, name=f"chasqui-sync-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, delivery: Delivery) -> None:
        self.outstanding += 1
        self._queue.put(delivery)

    def take_unstarted(self) -> list[Delivery]:
        """Remove and return the jobs no thread has picked up yet."""
        taken: list[Delivery] = []
        while True:
            try:
                delivery = self._queue.get_nowait()
            except queue.Empty:
                break
            if delivery is not None:
                taken.append(delivery)
        self.outstanding -= len(taken)
        return taken

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    # --- in the threads -----------------------------------------------------------

    def _run(self) -> None:
        done = self._done
        while True:
            d = self._queue.get()
            if d is None:
                return
            if self.stopping:
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
                self._loop.call_soon_threadsafe(self._drain)

    def _call(self, d: Delivery) -> Outcome:
        job, handler = d.job, d.handler
        started = now_ms()
        self.running[d.entry_id] = (job.task, job.id, started)
        t0 = time.perf_counter()
        try:
            result = handler.fn(*d.handler_args(self.worker_id), **job.kwargs)
            if job.result_ttl:
                check_json_types(result, "return value")
        except BaseException as exc:  # SystemExit from a handler fails its job, not the thread
            return (FAILED, d, exc, started, int((time.perf_counter() - t0) * 1000))
        finally:
            self.running.pop(d.entry_id, None)
        return (OK, d, result, started, int((time.perf_counter() - t0) * 1000))

    # --- on the loop ----------------------------------------------------------------

    def _drain(self) -> None:
        self._notified = False
        done = self._done
        items = []
        while done:
            items.append(done.popleft())
        self.outstanding -= len(items)
        if items:
            self._on_outcomes(items)
