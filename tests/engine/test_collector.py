"""The cyclic collector's young generation while a worker runs (chasqui_core/engine/worker/collector.py)."""

import asyncio
import gc
import time

import pytest

from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.worker.collector import YOUNG_GENERATION
from chasqui_core.engine.worker.worker import Worker


async def _thresholds_seen_by_a_job(redis, redis_url) -> int:
    """Run one job in a worker of this process; the young generation's threshold its handler saw."""
    seen: list[int] = []
    registry = HandlerRegistry()

    async def look():
        seen.append(gc.get_threshold()[0])

    registry.register("look", look)
    Queue("gc", redis_client=redis).add("look")
    worker = Worker(["gc"], registry, url=redis_url, install_signal_handlers=False)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 30
        while not seen:
            assert time.monotonic() < deadline, "the job did not run"
            assert not task.done(), task
            await asyncio.sleep(0.02)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    return seen[0]


@pytest.fixture
def threshold():
    """Put back the process's thresholds whatever a test does with them."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


async def test_a_running_worker_collects_its_young_generation_less_often_and_puts_the_threshold_back(
        redis, redis_url, threshold):
    gc.set_threshold(700, 10, 10)
    assert await _thresholds_seen_by_a_job(redis, redis_url) == YOUNG_GENERATION
    assert gc.get_threshold() == (700, 10, 10)


async def test_a_threshold_set_higher_or_a_collector_switched_off_is_left_alone(redis, redis_url, threshold):
    gc.set_threshold(YOUNG_GENERATION * 3, 10, 10)
    assert await _thresholds_seen_by_a_job(redis, redis_url) == YOUNG_GENERATION * 3
    assert gc.get_threshold() == (YOUNG_GENERATION * 3, 10, 10)
    gc.set_threshold(0)
    assert await _thresholds_seen_by_a_job(redis, redis_url) == 0
    assert gc.get_threshold()[0] == 0
