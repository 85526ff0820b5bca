"""Queue stats, pause/resume and worker heartbeats, read from a real server."""

import dataclasses
import os
import threading
import time

import msgpack
import pytest

from chasqui_core.engine.ops import stats
from chasqui_core.engine.jobs.envelope import Job, now_ms
from chasqui_core.engine.jobs.errors import InvalidQueueName
from chasqui_core.engine.store.keys import GROUP, QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.worker.worker import Worker


def server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def heartbeat(client, queues, worker_id, *, last_seen, in_flight=0, processed=0, failed=0):
    """Write a heartbeat the way worker.py's _heartbeat does."""
    info = msgpack.packb({
        "id": worker_id, "host": "host-a", "pid": 4242, "queues": list(queues),
        "concurrency": 8, "in_flight": in_flight, "processed": processed, "failed": failed,
        "started_at": last_seen - 60_000, "last_seen": last_seen,
    })
    for q in queues:
        client.hset(QueueKeys.for_queue(q).workers, worker_id, info)


def dlq_entry(client, queue, job_id):
    job = Job(job_id, "tasks.boom", errors=[{"attempt": 1, "class": "ValueError", "message": "bad"}])
    client.xadd(QueueKeys.for_queue(queue).dlq, {
        "j": job.encode(), "reason": "retries_exhausted", "task": job.task, "job_id": job.id,
        "source_id": "1-0", "error_class": "ValueError", "error": "bad",
    })


def server_major(client) -> int:
    return int(client.info("server")["redis_version"].split(".")[0])


def test_missing_queue_reads_as_zeros(redis):
    qs = stats.queue_stats(redis, "never-used")
    assert qs == stats.QueueStats(
        name="never-used", stream_length=0, pending=0, in_flight=0, delayed=0, overdue=0,
        oldest_overdue_age_ms=0, dlq=0, paused=False, workers=0, lag=None,
    )
    assert not stats.queue_exists(redis, "never-used")


def test_queue_without_consumer_group_has_no_pending(redis):
    Queue("fresh", redis_client=redis).add("tasks.a")
    qs = stats.queue_stats(redis, "fresh")
    assert (qs.stream_length, qs.pending, qs.lag) == (1, 0, None)


def test_stats_with_real_data(redis):
    q = Queue("emails", redis_client=redis)
    keys = q.keys
    for i in range(5):
        q.add("tasks.send", [i])
    for i in range(3):
        q.add("tasks.later", [i], delay=3_600_000)
    # a consumer took two entries and has not settled them
    redis.xgroup_create(keys.stream, GROUP, id="0")
    redis.xreadgroup(GROUP, "w1", {keys.stream: ">"}, count=2)
    # two delayed jobs the promoter has not moved yet
    now = server_ms(redis)
    redis.zadd(keys.delayed, {Job("late-1", "tasks.x").encode(): now - 5000,
                              Job("late-2", "tasks.x").encode(): now - 2000})
    dlq_entry(redis, "emails", "dead-1")
    dlq_entry(redis, "emails", "dead-2")
    stats.pause(redis, "emails")
    heartbeat(redis, ["emails"], "live-1", last_seen=now_ms(), in_flight=3)
    heartbeat(redis, ["emails"], "live-2", last_seen=now_ms(), in_flight=1)
    heartbeat(redis, ["emails"], "gone", last_seen=now_ms() - 60_000, in_flight=7)

    qs = stats.queue_stats(redis, "emails")

    assert qs.name == "emails"
    assert qs.stream_length == 5
    assert qs.pending == 2
    assert qs.delayed == 5
    assert qs.overdue == 2
    assert 5000 <= qs.oldest_overdue_age_ms < 5000 + 30_000
    assert qs.dlq == 2
    assert qs.paused is True
    assert qs.workers == 2
    assert qs.in_flight == 4
    if server_major(redis) >= 7:
        assert qs.lag == 3
    assert stats.queue_exists(redis, "emails")


def test_all_queue_stats_matches_single_calls(redis):
    for name, ready, later in (("a", 2, 0), ("b", 0, 4), ("c", 7, 1)):
        q = Queue(name, redis_client=redis)
        for i in range(ready):
            q.add("t", [i])
        for i in range(later):
            q.add("t", [i], delay=600_000)
    now = server_ms(redis)
    redis.zadd(QueueKeys.for_queue("c").delayed, {Job("over", "t").encode(): now - 1000})
    stats.pause(redis, "b")
    dlq_entry(redis, "a", "d")
    heartbeat(redis, ["a", "c"], "w", last_seen=now_ms(), in_flight=2)

    together = stats.all_queue_stats(redis)
    assert [s.name for s in together] == ["a", "b", "c"]
    one_by_one = [stats.queue_stats(redis, n) for n in ("a", "b", "c")]
    # the overdue age keeps growing between calls; everything else must match
    assert [dataclasses.replace(s, oldest_overdue_age_ms=0) for s in together] == \
        [dataclasses.replace(s, oldest_overdue_age_ms=0) for s in one_by_one]
    assert together[2].overdue == 1 and together[2].oldest_overdue_age_ms >= 1000
    assert (together[0].dlq, together[1].paused, together[1].delayed, together[2].workers) == (1, True, 4, 1)

    picked = stats.all_queue_stats(redis, ["c", "nope"])
    assert [s.name for s in picked] == ["c", "nope"]
    assert picked[1].stream_length == 0 and picked[1].lag is None
    assert stats.all_queue_stats(redis, []) == []


def test_all_queue_stats_rejects_bad_names(redis):
    with pytest.raises(InvalidQueueName):
        stats.all_queue_stats(redis, ["has space"])


def test_list_queues_sorted_and_skips_foreign_names(redis):
    for name in ("zeta", "alpha", "mid"):
        Queue(name, redis_client=redis).add("t")
    redis.sadd(QUEUES_REGISTRY, "not a queue!")
    assert stats.list_queues(redis) == ["alpha", "mid", "zeta"]


def test_queue_exists_by_stream_alone(redis):
    redis.xadd(QueueKeys.for_queue("orphan").stream, {"j": b"x"})
    assert stats.queue_exists(redis, "orphan")
    redis.sadd(QUEUES_REGISTRY, "registered")
    assert stats.queue_exists(redis, "registered")
    assert not stats.queue_exists(redis, "other")


def test_pause_and_resume_are_idempotent(redis):
    assert stats.pause(redis, "jobs") is True
    assert stats.pause(redis, "jobs") is False
    assert stats.queue_stats(redis, "jobs").paused is True
    assert redis.exists(QueueKeys.for_queue("jobs").paused)
    assert stats.resume(redis, "jobs") is True
    assert stats.resume(redis, "jobs") is False
    assert stats.queue_stats(redis, "jobs").paused is False


def test_workers_stale_flag_and_dedupe(redis):
    for name in ("a", "b", "c"):
        redis.sadd(QUEUES_REGISTRY, name)
    now = now_ms()
    heartbeat(redis, ["a"], "multi", last_seen=now - 1000)  # an older beat on one queue...
    heartbeat(redis, ["b"], "multi", last_seen=now, processed=9)  # ...a fresher one on the other
    heartbeat(redis, ["c"], "old", last_seen=now - 30_000)

    listed = stats.workers(redis)
    assert [w.id for w in listed] == ["multi", "old"]
    multi, old = listed
    assert multi.stale is False and multi.last_seen_ms == now and multi.processed == 9
    assert (multi.host, multi.pid, multi.concurrency, multi.queues) == ("host-a", 4242, 8, ["b"])
    assert old.stale is True
    assert stats.workers(redis, stale_after_ms=60_000)[1].stale is False
    assert [w.id for w in stats.workers(redis, "c")] == ["old"]
    assert stats.workers(redis, "unknown") == []


def test_prune_stale_workers(redis):
    for name in ("a", "b"):
        redis.sadd(QUEUES_REGISTRY, name)
    now = now_ms()
    heartbeat(redis, ["a", "b"], "dead", last_seen=now - 120_000)
    heartbeat(redis, ["a"], "alive", last_seen=now)
    redis.hset(QueueKeys.for_queue("b").workers, "garbage", b"\xc1 not msgpack")

    assert stats.prune_stale_workers(redis) == 3
    assert redis.hkeys(QueueKeys.for_queue("a").workers) == [b"alive"]
    assert redis.hlen(QueueKeys.for_queue("b").workers) == 0
    assert stats.prune_stale_workers(redis) == 0


def test_real_worker_shows_up_with_its_running_job(redis, redis_url):
    release = threading.Event()
    started = threading.Event()

    def slow(n):
        started.set()
        release.wait(30)
        return n

    registry = HandlerRegistry()
    registry.register("tasks.slow", slow)
    job_id = Queue("live", redis_client=redis).add("tasks.slow", [1]).job_id
    worker = Worker(["live"], registry, url=redis_url, concurrency=2, heartbeat_interval=0.05,
                    install_signal_handlers=False, shutdown_timeout=5)
    thread = threading.Thread(target=worker.run_sync, daemon=True)
    thread.start()
    try:
        assert started.wait(15), "the worker never started the job"
        deadline = time.monotonic() + 15
        qs = stats.queue_stats(redis, "live")
        # a heartbeat may be written between the job's hand-over and its start: wait for one that lists it
        while (qs.in_flight != 1 or not stats.workers(redis, "live")[0].current) and time.monotonic() < deadline:
            time.sleep(0.05)
            qs = stats.queue_stats(redis, "live")
        assert (qs.workers, qs.in_flight, qs.pending, qs.stream_length) == (1, 1, 1, 1)
        [info] = stats.workers(redis, "live")
        assert info.id == worker.id and info.pid == os.getpid()
        assert (info.queues, info.concurrency, info.stale) == (["live"], 2, False)
        assert [(j.task, j.job_id) for j in info.current] == [("tasks.slow", job_id)]
        assert abs(info.current[0].started_at_ms - now_ms()) < 60_000
        assert info.memory_kb > 1024  # a Python process is megabytes, whatever else it holds
    finally:
        release.set()
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    after = stats.queue_stats(redis, "live")
    assert (after.workers, after.pending, after.stream_length) == (0, 0, 0)
    assert stats.workers(redis) == []


def test_heartbeat_lists_running_async_jobs_oldest_first_and_forgets_finished_ones(redis, redis_url):
    import asyncio

    gates = {}

    async def wait_for_gate(n):
        gates[n] = asyncio.Event()
        await gates[n].wait()

    registry = HandlerRegistry()
    registry.register("tasks.gated", wait_for_gate)
    q = Queue("beats", redis_client=redis)
    first = q.add("tasks.gated", [1]).job_id
    worker = Worker(["beats"], registry, url=redis_url, concurrency=4, heartbeat_interval=0.05,
                    install_signal_handlers=False, shutdown_timeout=5)
    thread = threading.Thread(target=worker.run_sync, daemon=True)
    thread.start()

    def current():
        workers = stats.workers(redis, "beats")
        return [j.job_id for j in workers[0].current] if workers else []

    def wait_until(check, what):
        deadline = time.monotonic() + 15
        while not check() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert check(), what

    try:
        wait_until(lambda: current() == [first], "the first job never showed in the heartbeat")
        second = q.add("tasks.gated", [2]).job_id
        wait_until(lambda: current() == [first, second], "the second job never showed, after the first")
        worker._loop.call_soon_threadsafe(gates[1].set)
        wait_until(lambda: current() == [second], "the finished job stayed in the heartbeat")
        worker._loop.call_soon_threadsafe(gates[2].set)
        wait_until(lambda: current() == [], "a finished job stayed in the heartbeat")
    finally:
        for gate in list(gates.values()):
            worker._loop.call_soon_threadsafe(gate.set)
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
