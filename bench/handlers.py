"""The handlers the benchmark workers run, and how their runs are timed.

Handlers do nothing, so the numbers show what the queue itself costs. Each
one tells a ``Recorder`` when it starts: the first start opens the measured
window, and the n-th successful run lets the driver close it (once the
outcome is also acknowledged in Redis).
"""

from __future__ import annotations

import asyncio
import itertools
import time

from chasqui_core.engine.jobs.registry import HandlerRegistry, JobContext

NOOP = "bench.noop"
NOOP_SYNC = "bench.noop_sync"
FAIL_ONCE = "bench.fail_once"
STAMP = "bench.stamp"

TASK_OF = {"noop_async": NOOP, "noop_sync": NOOP_SYNC, "fail_once": FAIL_ONCE, "stamp": STAMP}
"""Handler kind (as a scenario names it) -> task name in the job."""

RETRY_BACKOFF_MS = 1


class FirstRunFails(Exception):
    """Raised on purpose by ``bench.fail_once`` on a job's first run."""


class Recorder:
    """When the first run started, and whether ``target`` runs succeeded.

    Safe from worker threads: ``itertools.count`` hands out numbers
    atomically, and the loop is told through ``call_soon_threadsafe``.
    """

    def __init__(self, target: int, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self.first: float | None = None
        self.first_cpu: float = 0.0
        """``time.process_time()`` at the first start: the worker's CPU cost is less noisy than its wall time."""
        self.done = asyncio.Event()
        self._loop = loop
        self._runs = itertools.count()
        self._successes = itertools.count(1)

    def started(self) -> None:
        if next(self._runs) == 0:
            self.first_cpu = time.process_time()
            self.first = time.perf_counter()

    def succeeded(self, threaded: bool = False) -> None:
        if next(self._successes) == self.target:
            if threaded:
                self._loop.call_soon_threadsafe(self.done.set)
            else:
                self.done.set()


def build_registry(recorder: Recorder, latencies: dict[str, list[tuple[int, int]]] | None = None) -> HandlerRegistry:
    """The benchmark handlers; ``latencies`` collects (stamp, start) pairs of ``bench.stamp`` runs by phase."""
    registry = HandlerRegistry()

    async def noop(*args) -> None:
        recorder.started()
        recorder.succeeded()

    def noop_sync(*args) -> None:
        recorder.started()
        recorder.succeeded(threaded=True)

    async def fail_once(ctx: JobContext, *args) -> None:
        recorder.started()
        if ctx.attempt == 1:
            raise FirstRunFails("the first run of every job fails on purpose")
        recorder.succeeded()

    async def stamp(stamp_ns: int, phase: str) -> None:
        latencies.setdefault(phase, []).append((stamp_ns, time.time_ns()))

    registry.register(NOOP, noop)
    registry.register(NOOP_SYNC, noop_sync)
    registry.register(FAIL_ONCE, fail_once, takes_context=True, max_attempts=3, backoff=RETRY_BACKOFF_MS)
    if latencies is not None:
        registry.register(STAMP, stamp)
    return registry
