"""The sync lane wakes few threads for quick jobs, and every thread for slow ones.

A woken thread takes jobs until none waits, and the loop wakes another only
when none is awake or when jobs wait and none was taken for a while. These
tests hold the lane to its promise of ``concurrency`` sync runs at once: jobs
that can only finish together (a barrier of all of them) must all run at the
same time, in one burst and again in a second one after the lane went back to
sleep.
"""

from __future__ import annotations

import asyncio
import threading
import time

from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.worker.worker import Worker

BARRIER_TIMEOUT_S = 60.0
"""Generous: a busy host may take long to start threads, but a lane that never wakes them never gets there."""


async def _run_until(redis, worker: Worker, done) -> None:
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S * 2
        while not done():
            assert not task.done(), "the worker stopped early"
            assert time.monotonic() < deadline, "the jobs did not finish"
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 60)


async def test_slow_sync_jobs_spread_over_the_whole_lane(redis, redis_url):
    size = 12
    barrier = threading.Barrier(size, timeout=BARRIER_TIMEOUT_S)
    finished: list[str] = []
    threads: set[str] = set()

    def together(i: int) -> None:
        threads.add(threading.current_thread().name)
        barrier.wait()  # every job of the burst must be running at once to pass
        finished.append(f"{i}")

    registry = HandlerRegistry()
    registry.register("together", together)
    q = Queue("lane-spread", redis_client=redis)
    worker = Worker(["lane-spread"], registry, url=redis_url, concurrency=size, install_signal_handlers=False)

    q.add_bulk([JobSpec("together", [i]) for i in range(size)])

    async def second_burst() -> None:
        while len(finished) < size:
            await asyncio.sleep(0.05)
        barrier.reset()
        await asyncio.sleep(0.2)  # the lane's threads go back to sleep
        q.add_bulk([JobSpec("together", [size + i]) for i in range(size)])

    burst = asyncio.create_task(second_burst())
    await _run_until(redis, worker, lambda: len(finished) >= 2 * size)
    await burst
    assert sorted(int(i) for i in finished) == list(range(2 * size))
    assert len(threads) == size
    assert redis.xlen(q.keys.dlq) == 0


async def test_jobs_of_half_a_millisecond_spread_too(redis, redis_url):
    """Jobs that wait on I/O for less than the lane's look (a quick query) still get more threads: a job that
    waited a whole look wakes more, whether or not the awake threads took others meanwhile."""
    size, jobs = 16, 400
    lock = threading.Lock()
    running = [0]
    most = [0]
    finished: list[int] = []

    def query(i: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.0005)  # releases the GIL, as a database driver does while it waits
        with lock:
            running[0] -= 1
        finished.append(i)

    registry = HandlerRegistry()
    registry.register("query", query)
    q = Queue("lane-quick-io", redis_client=redis)
    q.add_bulk([JobSpec("query", [i]) for i in range(jobs)])
    worker = Worker(["lane-quick-io"], registry, url=redis_url, concurrency=size, install_signal_handlers=False)
    await _run_until(redis, worker, lambda: len(finished) >= jobs)
    assert sorted(finished) == list(range(jobs))
    assert most[0] >= 4, f"at most {most[0]} jobs ran at once on a lane of {size} threads"
