"""The sampler's reader: incremental counter windows equal a full read, depth history, totals."""

from __future__ import annotations

import dataclasses

import pytest

from chasqui_core.engine.ops import metrics
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from dashboard.readings import SECOND_WINDOW, Reader


def _server_ms(redis) -> int:
    s, us = redis.time()
    return int(s) * 1000 + int(us) // 1000


def _bump(redis, queue: str, second: int, **fields: int) -> None:
    keys = QueueKeys.for_queue(queue)
    for name, value in fields.items():
        redis.hincrby(f"{keys.second_counters}{second}", name, value)
        redis.hincrby(f"{keys.minute_counters}{second // 60}", name, value)


def test_incremental_reads_match_a_full_read(redis):
    Queue("a", redis_client=redis).add("t")
    Queue("b", redis_client=redis).add("t")
    now = _server_ms(redis) // 1000
    for back in (200, 120, 30, 3, 1, 0):
        _bump(redis, "a", now - back, retried=back + 1, completed=2)
    reader = Reader(redis)
    first = reader.read(["a", "b"])
    _bump(redis, "a", now, retried=5)  # the newest bucket keeps filling after it was read
    _bump(redis, "b", now - 1, failed=7)
    again = reader.read(["a", "b"])
    for name in ("a", "b"):
        full = metrics.series(redis, name, window=SECOND_WINDOW, now_ms=again.now_ms)
        assert again.queues[name].seconds.points == full.points
        assert again.queues[name].seconds.start_ms == full.start_ms
    assert again.queues["a"].total("retried") == first.queues["a"].total("retried") + 5
    assert again.total.total("failed") == 7


def test_live_rates_count_the_part_of_the_current_second_already_past(redis):
    Queue("a", redis_client=redis).add("t")
    now = _server_ms(redis) // 1000
    for back in range(1, 11):
        _bump(redis, "a", now - back, completed=3)
    _bump(redis, "a", now, failed=1)  # a first failure, in the second still filling
    reading = Reader(redis).read(["a"])
    if reading.now_ms // 1000 != now:
        pytest.skip("the second turned during the test; the rate window moved")
    elapsed = (reading.now_ms % 1000) / 1000
    live = reading.queues["a"]
    assert live.rate("failed") == pytest.approx(1 / (10 + elapsed)), "a failure shows in the next reading"
    assert live.rate("failed") > 0
    # a steady rate reads the same whatever part of the second has passed
    assert live.rate("completed") == pytest.approx(30 / (10 + elapsed))
    steady = dataclasses.replace(live, now_ms=now * 1000)
    assert steady.rate("completed") == pytest.approx(3.0)


def test_depth_is_sampled_into_redis_and_shared(redis):
    queue = Queue("d", redis_client=redis)
    for i in range(4):
        queue.add("t", [i], delay=60)
    one, two = Reader(redis), Reader(redis)  # two server processes
    one.read(["d"])
    reading = two.read(["d"])
    assert reading.queues["d"].depth[-1] == 4 and reading.queues["d"].delayed == 4
    assert len(reading.queues["d"].depth) == SECOND_WINDOW
    assert redis.ttl(QueueKeys.for_queue("d").console_depth) > 0
    assert redis.zcard(QueueKeys.for_queue("d").console_depth) >= 1


def test_a_worker_serving_two_queues_counts_once_in_the_total(redis):
    import msgpack

    now = _server_ms(redis)
    info = msgpack.packb({"id": "w1", "host": "h", "pid": 1, "queues": ["a", "b"], "concurrency": 2,
                          "in_flight": 0, "processed": 0, "failed": 0, "started_at": now, "last_seen": now})
    for q in ("a", "b"):
        Queue(q, redis_client=redis).add("t")
        redis.hset(QueueKeys.for_queue(q).workers, "w1", info)
    reading = Reader(redis).read(["a", "b"])
    assert reading.queues["a"].workers == 1 and reading.queues["b"].workers == 1
    assert reading.total.workers == 1
    assert [w.id for w in reading.workers_of("b")] == ["w1"]
