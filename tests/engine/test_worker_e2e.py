"""The worker end to end: real worker processes against a real server.

Workers run as separate processes (tests/engine/worker_app.py); their handlers
record every run in a Redis list, which is how these tests see what ran.
"""

import asyncio
import signal
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, UTC

import pytest

from chasqui_core.engine.jobs import events
from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.worker.worker import Worker
from tests.engine.worker_app import (
    DONE_SUFFIX,
    RUNS_KEY,
    dlq_entries,
    read_runs,
    runs_by_job,
    settled,
    wait_for,
)


def duplicates(by_job, expected_runs=1):
    return {job: len(runs) for job, runs in by_job.items() if len(runs) != expected_runs}


@pytest.mark.timeout(150)
def test_ten_thousand_jobs_run_exactly_once_on_two_workers(redis, workers):
    n = 10_000
    procs = [workers.start("bulk", visibility_ms=5000) for _ in range(2)]
    workers.wait_ready(redis, "bulk", 2)
    added = Queue("bulk", redis_client=redis).add_bulk([JobSpec("noop", [i]) for i in range(n)])
    ids = {e.job_id for e in added}
    assert len(ids) == n

    wait_for(lambda: redis.llen(RUNS_KEY) >= n, 120, f"{n} runs")
    wait_for(lambda: settled(redis, "bulk"), 20, "the stream and pending list to empty")
    time.sleep(0.3)  # a duplicate run would land now

    runs = read_runs(redis)
    by_job = runs_by_job(runs)
    assert set(by_job) == ids
    assert duplicates(by_job) == {}
    assert {r.pid for r in runs} == {p.pid for p in procs}, "both workers should have taken part"
    assert dlq_entries(redis, "bulk") == []


@pytest.mark.timeout(90)
def test_sigterm_lets_running_jobs_finish_and_returns_the_rest(redis, workers):
    # A long read block keeps the reader away from the stop flag for a while:
    # jobs fetched but not started must still not start once SIGTERM is in.
    proc = workers.start("drain", concurrency=10, block_ms=3000)
    workers.wait_ready(redis, "drain", 1)
    q = Queue("drain", redis_client=redis)
    added = q.add_bulk([JobSpec("slow", kwargs={"seconds": 1.0}) for _ in range(20)])
    ids = {e.job_id for e in added}

    wait_for(lambda: redis.llen(RUNS_KEY) >= 10, 20, "10 slow jobs to start")
    proc.send_signal(signal.SIGTERM)
    started = {r.job_id for r in read_runs(redis)}
    assert len(started) == 10  # concurrency 10: the others wait in the worker's inbox
    assert proc.wait(30) == 0, workers.logs()

    runs = read_runs(redis)
    assert len(runs) == 10, "no job may start after SIGTERM"
    finished = [j.decode() for j in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)]
    assert sorted(finished) == sorted(started), "every running job finishes, once"
    keys = QueueKeys.for_queue("drain")
    assert redis.xpending(keys.stream, "chasqui")["pending"] == 0
    returned = [decode(fields[b"j"]).id for _, fields in redis.xrange(keys.stream)]
    assert sorted(returned) == sorted(ids - started), "the unstarted jobs are back in the stream"

    workers.start("drain", concurrency=10)
    wait_for(lambda: redis.llen(RUNS_KEY + DONE_SUFFIX) >= 20, 30, "the returned jobs to run")
    wait_for(lambda: settled(redis, "drain"), 10, "the queue to settle")
    by_job = runs_by_job(read_runs(redis))
    assert set(by_job) == ids
    assert duplicates(by_job) == {}


@pytest.mark.timeout(60)
def test_bad_entries_are_dead_lettered_and_the_worker_keeps_going(redis, workers):
    proc = workers.start("bad")
    workers.wait_ready(redis, "bad", 1)
    keys = QueueKeys.for_queue("bad")
    q = Queue("bad", redis_client=redis)
    foreign = redis.xadd(keys.stream, {"hello": "world"}).decode()
    garbage = redis.xadd(keys.stream, {"j": b"\xc1 not msgpack at all"}).decode()
    unknown = q.add("no_such_task", [1])
    good = q.add("noop")

    wait_for(lambda: read_runs(redis), 20, "the good job to run")
    assert [r.job_id for r in read_runs(redis)] == [good.job_id]
    wait_for(lambda: redis.xlen(keys.dlq) >= 3, 10, "three dead-letter entries")
    wait_for(lambda: settled(redis, "bad"), 10, "the queue to settle")
    assert proc.poll() is None, "the worker must survive bad input"

    dead = {e["source_id"].decode(): e for e in dlq_entries(redis, "bad")}
    assert set(dead) == {foreign, garbage, unknown.entry_id}
    assert dead[foreign]["reason"] == b"decode_failed"
    assert b"no 'j' field" in dead[foreign]["error"]
    assert dead[garbage]["reason"] == b"decode_failed"
    assert dead[garbage]["j"] == b"\xc1 not msgpack at all", "the bytes are kept for inspection"
    assert b"not a msgpack job envelope" in dead[garbage]["error"]
    assert dead[unknown.entry_id]["reason"] == b"unknown_task"
    assert dead[unknown.entry_id]["job_id"].decode() == unknown.job_id
    assert b"no task named 'no_such_task'" in dead[unknown.entry_id]["error"]


@pytest.mark.timeout(60)
def test_oversize_job_is_dead_lettered(redis, workers):
    workers.start("big", max_payload_bytes=2000)
    workers.wait_ready(redis, "big", 1)
    q = Queue("big", redis_client=redis)
    big = q.add("noop", kwargs={"blob": "x" * 10_000})
    small = q.add("noop", kwargs={"blob": "x" * 100})

    wait_for(lambda: read_runs(redis), 20, "the small job to run")
    wait_for(lambda: redis.xlen(q.keys.dlq) >= 1, 10, "the big job to be dead-lettered")
    wait_for(lambda: settled(redis, "big"), 10, "the queue to settle")
    assert [r.job_id for r in read_runs(redis)] == [small.job_id]
    [entry] = dlq_entries(redis, "big")
    assert entry["reason"] == b"oversize"
    assert entry["source_id"].decode() == big.entry_id
    assert decode(entry["j"]).id == big.job_id
    assert b"at most 2000" in entry["error"]


@pytest.mark.timeout(60)
async def test_events_and_counters_add_up(redis, redis_url):
    registry = HandlerRegistry()
    runs: Counter = Counter()

    def ok(i):
        runs[("ok", i)] += 1

    def flaky(i):
        runs[("flaky", i)] += 1
        if runs[("flaky", i)] == 1:
            raise ValueError("first run fails")

    def broken(i):
        runs[("broken", i)] += 1
        raise ValueError("always fails")

    registry.register("ok", ok)
    registry.register("flaky", flaky, backoff=BackoffSpec.fixed(10))
    registry.register("broken", broken, max_attempts=2, backoff=BackoffSpec.fixed(20))
    q = Queue("ev", redis_client=redis)
    q.add_bulk([JobSpec("ok", [i]) for i in range(30)] + [JobSpec("flaky", [i]) for i in range(10)]
               + [JobSpec("broken", [i]) for i in range(5)])
    successes, retries, dead = 30 + 10, 10 + 5, 5

    received: list[events.Event] = []
    unsubscribe = events.subscribe(received.append)
    worker = Worker(["ev"], registry, url=redis_url, concurrency=5, install_signal_handlers=False)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 30
        while not (redis.xlen(q.keys.dlq) >= dead
                   and sum(1 for e in received if e.type == events.COMPLETED) >= successes
                   and settled(redis, "ev")):
            assert time.monotonic() < deadline, f"timed out; runs so far: {dict(runs)}"
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        unsubscribe()

    # the events stream, as any process can read it
    stream: list[events.Event] = []
    after = "0-0"
    while True:
        after, batch = events.read_events(redis, "ev", after)
        if not batch:
            break
        stream += batch
    by_type = defaultdict(list)
    for e in stream:
        by_type[e.type].append(e)
    assert len(by_type[events.COMPLETED]) == successes
    assert len({e.job_id for e in by_type[events.COMPLETED]}) == successes
    assert len(by_type[events.RETRY_SCHEDULED]) == retries
    assert {(e.task, e.attempt) for e in by_type[events.RETRY_SCHEDULED]} == {("flaky", 1), ("broken", 1)}
    assert {e.backoff_ms for e in by_type[events.RETRY_SCHEDULED] if e.task == "flaky"} == {10}
    assert len(by_type[events.DLQ]) == dead
    assert {(e.task, e.reason) for e in by_type[events.DLQ]} == {("broken", "retries_exhausted")}
    assert sum(e.count for e in by_type[events.PROMOTED]) == retries

    # the time-bucketed counters
    for prefix in (q.keys.second_counters, q.keys.minute_counters):
        totals: Counter = Counter()
        for key in redis.scan_iter(f"{prefix}*"):
            totals.update({k.decode(): int(v) for k, v in redis.hgetall(key).items()})
        assert totals == Counter(enqueued=45, completed=successes, retried=retries, failed=retries + dead,
                                 dlq=dead, promoted=retries, fetched=45 + retries,
                                 **{"dlq:retries_exhausted": dead}), prefix

    # the in-process subscriber
    scheduled = [e for e in received if e.type == events.RETRY_SCHEDULED]
    assert len(scheduled) == retries
    assert all(e.queue == "ev" and e.attempt == 1 and e.job_id for e in scheduled)
    assert sorted(e.task for e in scheduled) == ["broken"] * 5 + ["flaky"] * 10
    assert {e.backoff_ms for e in scheduled if e.task == "flaky"} == {10}
    assert {e.backoff_ms for e in scheduled if e.task == "broken"} == {20}
    assert sum(1 for e in received if e.type == events.DLQ) == dead
    assert runs == Counter({**{("ok", i): 1 for i in range(30)}, **{("flaky", i): 2 for i in range(10)},
                            **{("broken", i): 2 for i in range(5)}})


@pytest.mark.timeout(150)
def test_concurrent_promoters_move_each_due_entry_once(redis, workers):
    n = 20_000
    q = Queue("promo", redis_client=redis)
    past = datetime.now(UTC) - timedelta(seconds=5)
    added = q.add_bulk([JobSpec("noop", [i], run_at=past) for i in range(n)])
    ids = {e.job_id for e in added}
    assert redis.zcard(q.keys.delayed) == n and redis.xlen(q.keys.stream) == 0

    for _ in range(3):
        workers.start("promo", lock_ttl_ms=300, visibility_ms=10_000)
    wait_for(lambda: redis.llen(RUNS_KEY) >= n, 120, f"{n} runs")
    wait_for(lambda: settled(redis, "promo"), 20, "the queue to settle")
    time.sleep(0.3)

    by_job = runs_by_job(read_runs(redis))
    assert set(by_job) == ids
    assert duplicates(by_job) == {}
    promoted = sum(int(redis.hget(key, "promoted") or 0) for key in redis.scan_iter(f"{q.keys.second_counters}*"))
    assert promoted == n, "each entry is promoted exactly once"
