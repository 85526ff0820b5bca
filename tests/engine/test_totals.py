"""All-time counters and run-duration histograms, written by the Lua scripts and read back."""

import asyncio
import time

from chasqui_core.engine.ops import totals
from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.worker.worker import Worker
from tests.engine.worker_app import settled


def test_duration_increments_count_each_bucket_once_per_task():
    tasks = ["a", "b", "a", "a", "b", "a", "a"]
    durations = [0, 7, 5, 6, 400_000, 300_000, 1_000]
    flat = totals.duration_increments(tasks, durations)
    fields = dict(zip(flat[::2], flat[1::2], strict=False))
    assert fields == {
        "5:a": 2, "10:a": 1, "1000:a": 1, "300000:a": 1, "sum:a": 301_011,
        "10:b": 1, "inf:b": 1, "sum:b": 400_007,
    }
    assert len(fields) * 2 == len(flat), "one increment per field"
    assert totals.duration_increments(["a"] * 3, [1, 2, 3]) == ["5:a", 3, "sum:a", 6]
    assert totals.duration_increments([], []) == []


def test_parse_reads_buckets_sums_and_ignores_unknown_fields():
    parsed = totals.parse(
        "q",
        {b"completed": b"4", b"enqueued": b"9", b"from_the_future": b"1", b"lost": b"2", b"dlq:panic": b"2",
         b"dlq:retries_exhausted": b"5", b"dlq:": b"7"},
        {b"5:t.a": b"3", b"inf:t.a": b"1", b"sum:t.a": b"9000", b"7:t.a": b"99", b"sum:odd:name": b"5",
         b"10:odd:name": b"2"},
    )
    assert parsed.counters == {"enqueued": 9, "fetched": 0, "completed": 4, "failed": 0, "retried": 0, "dlq": 0,
                               "replayed": 0, "promoted": 0, "skipped": 0, "bad_signature": 0, "deferred": 0,
                               "purged": 0, "lost": 2, "lost_contact": 0, "recovered": 0,
                               "dlq_trimmed": 0,
                               "batches_started": 0, "batches_succeeded": 0, "batches_completed": 0, "callbacks": 0}
    assert parsed.dead_lettered == {"panic": 2, "retries_exhausted": 5}, "per reason; a field with no reason is not one"
    a = parsed.durations["t.a"]
    assert a.counts[0] == 3 and a.counts[-1] == 1 and a.count == 4 and a.sum_ms == 9000
    odd = parsed.durations["odd:name"]
    assert odd.counts[1] == 2 and odd.sum_ms == 5


async def test_a_worker_counts_every_outcome_and_each_run_duration(redis, redis_url):
    registry = HandlerRegistry()
    runs: dict[int, int] = {}

    def ok(i):
        pass

    def slow(i):
        time.sleep(0.03)

    def flaky(i):
        runs[i] = runs.get(i, 0) + 1
        if runs[i] == 1:
            raise ValueError("first run fails")

    def broken(i):
        raise ValueError("always fails")

    registry.register("ok", ok)
    registry.register("slow", slow)
    registry.register("flaky", flaky, backoff=BackoffSpec.fixed(10))
    registry.register("broken", broken, max_attempts=2, backoff=BackoffSpec.fixed(10))
    q = Queue("tot", redis_client=redis)
    q.add_bulk([JobSpec("ok", [i]) for i in range(6)] + [JobSpec("slow", [i]) for i in range(2)]
               + [JobSpec("flaky", [i]) for i in range(4)] + [JobSpec("broken", [i]) for i in range(3)])
    q.add("ok", [98], job_id="once")
    q.add("ok", [98], job_id="once")  # refused as a duplicate: not counted

    worker = Worker(["tot"], registry, url=redis_url, concurrency=4, install_signal_handlers=False)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 30
        while not (redis.xlen(q.keys.dlq) >= 3 and settled(redis, "tot")
                   and totals.read_totals(redis, ["tot"])["tot"].counters["completed"] >= 13):
            assert time.monotonic() < deadline, totals.read_totals(redis, ["tot"])
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)

    q.add("ok", [99], delay=3_600_000)  # counted when added, though it has not run
    dead = DeadLetters(redis, "tot")
    first = dead.page(limit=1).items[0]
    assert dead.replay([first.entry_id]) == 1
    assert dead.replay([first.entry_id]) == 0, "an entry replayed already is not counted again"

    got = totals.read_totals(redis, ["tot"])["tot"]
    assert got.counters == {"enqueued": 17, "fetched": 16 + 7, "completed": 13, "failed": 4 + 6, "retried": 4 + 3,
                            "dlq": 3, "replayed": 1, "promoted": 7, "skipped": 0, "bad_signature": 0, "deferred": 0,
                            "purged": 0, "lost": 0, "lost_contact": 0, "recovered": 0, "dlq_trimmed": 0,
                            "batches_started": 0, "batches_succeeded": 0, "batches_completed": 0, "callbacks": 0}
    assert got.dead_lettered == {"retries_exhausted": 3}
    assert set(got.durations) == {"ok", "slow", "flaky", "broken"}
    assert {t: h.count for t, h in got.durations.items()} == {"ok": 7, "slow": 2, "flaky": 8, "broken": 6}
    slow_runs = got.durations["slow"]
    below_30ms = totals.DURATION_BOUNDS_MS.index(25) + 1
    assert sum(slow_runs.counts[:below_30ms]) == 0, "a 30 ms run never lands at or below 25 ms"
    assert slow_runs.sum_ms >= 60


async def test_a_repeated_settle_call_counts_nothing_twice(redis, redis_url):
    keys = QueueKeys.for_queue("rep")
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    ids = [redis.xadd(keys.stream, {"j": b"x"}) for _ in range(3)]
    redis.xreadgroup(GROUP, "c1", {keys.stream: ">"}, count=3)
    client = aconnect(redis_url)
    try:
        settler = Settler(client, Scripts(client))
        settler.complete(keys, ids[0], "j0", "t", 3)
        settler.complete(keys, ids[1], "j1", "t", 30)
        settler.retry(keys, ids[2], 60_000, b"payload", job_id="j2", task="t", attempt=1, error_class="E",
                      error="x", duration_ms=7)
        batch = settler._batches[keys.stream]
        await settler.flush()
        first = totals.read_totals(redis, ["rep"])["rep"]
        await settler._flush_one(keys, batch)  # sent again, as after a reply lost on the way back
        assert totals.read_totals(redis, ["rep"])["rep"] == first
    finally:
        await client.aclose()
    assert (first.counters["completed"], first.counters["retried"], first.counters["failed"]) == (2, 1, 1)
    histogram = first.durations["t"]
    assert histogram.counts == (1, 1, 0, 1) + (0,) * (len(totals.DURATION_BOUNDS_MS) - 3)
    assert histogram.sum_ms == 40


def test_runs_lost_and_jobs_recovered_from_a_dead_worker_are_in_the_totals(redis, redis_url):
    """A worker that died holding six entries, running one: what reclaim did is in the totals, not in the raw hash
    only."""
    from tests.engine.test_accounting import bury, ghost_reads, recorder, running
    from tests.engine.worker_app import wait_for

    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("reclaimed")
    q = Queue(keys.queue, redis_client=redis)
    for _ in range(6):
        q.add("t")
    ghost_reads(redis, keys, "ghost", running=1)  # it had started the first of the six it fetched
    bury(redis, keys, "ghost")  # its death on record, as its supervisor writes it: the run is lost, not cut off
    time.sleep(0.3)
    with running(redis_url, [keys.queue], registry, visibility_timeout_ms=250):
        wait_for(lambda: len(runs) == 6, 10, "all six jobs to run")
        wait_for(lambda: totals.read_totals(redis, [keys.queue])[keys.queue].counters["completed"] == 6, 5,
                 "their outcomes")
    got = totals.read_totals(redis, [keys.queue])[keys.queue]
    assert (got.counters["lost"], got.counters["lost_contact"], got.counters["recovered"]) == (1, 0, 5)
    assert got.counters["fetched"] >= 6, "the live worker read all six again"
    assert got.dead_lettered == {}
