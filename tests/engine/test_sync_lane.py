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
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.sync_lane import QUICK_PER_LOOK, SyncLane
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


async def test_a_backlog_of_quick_jobs_wakes_no_more_threads_and_slow_ones_do(redis_url):
    """The loop's look wakes more threads only for jobs that hold their thread (a query): a thread that took
    ``QUICK_PER_LOOK`` or more since the last look runs quick jobs, which mostly hold the GIL, and more threads would
    only take it from each other (a backlog of noop Django tasks woke the whole lane and cost three times the CPU)."""
    lane = SyncLane(8, "lane-look", lambda outcomes: None, StartJournal("lane-look", redis_url))
    try:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while len(lane._asleep) < 8:  # every thread started and asleep
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        woken: list[int] = []
        lane._wake_up = woken.append  # count the wake-ups instead of making them (no thread takes the stand-ins)
        lane._waiting.lines[1].extend([object()] * 1000)  # a backlog: it waited at the last look and still does
        lane._seen, lane._seen_waiting = 0, 1000
        lane._taken = QUICK_PER_LOOK  # the awake thread took that many in the look: quick jobs
        lane._spread()
        assert woken == [], "quick jobs woke more threads"
        lane._taken += QUICK_PER_LOOK - 1  # fewer in the next look: slower jobs, which wait on something
        lane._spread()
        assert woken == [1], "a job that waited a look behind slow ones woke no thread"
    finally:
        if lane._spreading is not None:
            lane._spreading.cancel()
            lane._spreading = None
        lane._waiting.lines[1].clear()
        lane.close()


async def test_an_outcome_is_settled_while_its_thread_runs_a_long_job_with_more_waiting(redis, redis_url):
    """A busy thread leaves its outcomes for the loop's next look rather than waking the loop per job (each wake
    handed the GIL over at the thread's next send); one that then runs a long job must not hold them back."""
    queue = "lane-outcome-look"
    keys = QueueKeys.for_queue(queue)
    seen: list[bool] = []

    def quick(i: int) -> None:
        pass

    def long(_: int) -> None:  # waits until the quick job before it is settled (or gives up)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if int(redis.hget(keys.metrics + "total", "completed") or 0) >= 1:
                seen.append(True)
                return
            time.sleep(0.01)
        seen.append(False)

    registry = HandlerRegistry()
    registry.register("quick", quick)
    registry.register("long", long)
    q = Queue(queue, redis_client=redis)
    q.add_bulk([JobSpec("quick", [0]), JobSpec("long", [1]), JobSpec("quick", [2])])
    worker = Worker([queue], registry, url=redis_url, concurrency=1, install_signal_handlers=False)
    await _run_until(redis, worker, lambda: int(redis.hget(keys.metrics + "total", "completed") or 0) >= 3)
    assert seen == [True], "the first job's outcome waited for the long job after it"
