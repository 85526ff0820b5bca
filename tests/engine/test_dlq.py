"""The dead-letter queue operations, against a real server.

Small DLQs come from real workers (a handler that raises, a job whose worker
"died"); bulk DLQs are written the way settle.lua writes them.
"""

import asyncio
import threading
import time
from collections import Counter

import pytest

from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.fingerprint import fingerprint
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.envelope import Job, decode, now_ms
from chasqui_core.engine.jobs.errors import UnrecoverableError
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.recovery.reclaim import add_death_record
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RetryPolicy
from chasqui_core.engine.worker.worker import Worker
from tests.helpers import reclaim_now
from tests.engine.dlq_entries import KEYS, Q, add_dead, bulk_dead, dead_job, fields_for, stream_jobs


@pytest.fixture
def dl(redis):
    return DeadLetters(redis, Q)


# --- running a real worker --------------------------------------------------------


def run_worker(redis_url, registry, until, *, timeout=20.0, **options):
    """Run a worker until ``until()`` is true, then stop it and wait for it to finish."""

    async def main():
        worker = Worker([Q], registry, url=redis_url, concurrency=4, block_ms=50, install_signal_handlers=False,
                        promoter_poll_interval=0.05, heartbeat_interval=0.5, **options)
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + timeout
        try:
            while True:
                await asyncio.sleep(0.02)
                if task.done():
                    task.result()
                    raise AssertionError("the worker stopped on its own")
                if until():
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"condition not reached within {timeout}s")
        finally:
            worker.request_stop()
            await task

    asyncio.run(main())


FAST_RETRIES = RetryPolicy(max_attempts=2, backoff=BackoffSpec.fixed(0))


def test_replay_by_id_resets_attempts_and_the_job_then_runs(redis, redis_url, dl):
    seen, state = [], {"fail": True}

    def handler(ctx, n):
        seen.append((ctx.job.id, ctx.job.attempt, ctx.job.replays, len(ctx.job.errors)))
        if state["fail"]:
            raise UnrecoverableError(f"user {n} not found")
        return n

    registry = HandlerRegistry()
    registry.register("users.sync", handler, takes_context=True)
    enq = Queue(Q, redis_client=redis).add("users.sync", [42])
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 1, policy=FAST_RETRIES)

    assert dl.count() == 1
    dead = dl.page().items[0]
    assert (dead.reason, dead.job_id, dead.task) == ("unrecoverable", enq.job_id, "users.sync")
    assert dead.error_class.endswith("UnrecoverableError") and dead.error == "user 42 not found"
    assert [e["message"] for e in dead.errors] == ["user 42 not found"]
    assert dl.get(dead.entry_id).job_id == enq.job_id

    assert dl.replay([dead.entry_id]) == 1
    assert dl.count() == 0
    [back] = stream_jobs(redis)
    assert (back.id, back.attempt, back.replays, back.deaths) == (enq.job_id, 0, 1, 0)
    assert [e["message"] for e in back.errors] == ["user 42 not found"]
    assert dl.replay([dead.entry_id]) == 0  # already moved

    state["fail"] = False
    run_worker(redis_url, registry, lambda: len(seen) == 2 and redis.xlen(KEYS.stream) == 0, policy=FAST_RETRIES)
    assert seen == [(enq.job_id, 0, 0, 0), (enq.job_id, 0, 1, 1)]
    assert dl.count() == 0


def test_replay_granting_one_more_attempt(redis, redis_url, dl):
    calls = []

    def handler(n):
        calls.append(n)
        raise ValueError(f"remote said no ({len(calls)})")

    registry = HandlerRegistry()
    registry.register("pay", handler)
    Queue(Q, redis_client=redis).add("pay", [7])
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 1, policy=FAST_RETRIES)
    dead = dl.page().items[0]
    assert (dead.reason, dead.job.attempt, len(calls)) == ("retries_exhausted", 2, 2)

    assert dl.replay([dead.entry_id], reset_attempts=False) == 1
    [back] = stream_jobs(redis)
    assert (back.attempt, back.max_attempts, back.replays) == (2, 3, 1)

    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 1, policy=FAST_RETRIES)
    assert len(calls) == 3  # exactly one more run, then back to the DLQ
    again = dl.page().items[0]
    assert again.reason == "retries_exhausted" and again.job_id == dead.job_id
    assert [e["attempt"] for e in again.errors] == [1, 2, 3]
    assert again.job.replays == 1


def test_panic_from_dead_workers_is_dead_lettered_with_a_worker_lost_record_per_lost_run(redis, redis_url, dl):
    enq = Queue(Q, redis_client=redis).add("media.transcode", ["big.mov"])
    redis.xgroup_create(KEYS.stream, GROUP, id="0", mkstream=True)
    # Two workers ran the job in turn and vanished mid-run: each wrote its start journal, neither is alive.
    for ghost in ("ghost-1", "ghost-2"):
        [(_, [(entry_id, _)])] = redis.xreadgroup(GROUP, ghost, {KEYS.stream: ">"}, count=1)
        redis.hset(KEYS.running(ghost), entry_id, now_ms() - 1000)
        add_death_record(redis, KEYS, ghost, "killed by signal 9", now_ms())  # as its supervisor records it
        time.sleep(0.25)
        reclaim_now(redis_url, KEYS, min_idle_ms=200)
    ran = []
    registry = HandlerRegistry()
    registry.register("media.transcode", lambda *a: ran.append(a))
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 1, visibility_timeout_ms=200)

    assert ran == [], "a poison pill never runs a third time"
    [raw_id] = [eid for eid, _ in redis.xrange(KEYS.dlq)]
    dead = dl.get(raw_id.decode())
    assert (dead.reason, dead.job_id, dead.task) == ("panic", enq.job_id, "media.transcode")
    assert [(e["attempt"], e["class"], e["worker"]) for e in dead.errors] == [
        (1, "WorkerLost", "ghost-1"), (2, "WorkerLost", "ghost-2")]
    assert dead.error == "the job was running when its worker died 2 times"
    assert DLQFilter(task="media.transcode").matches(dead)
    assert dl.page(filter=DLQFilter(task="media.transcode")).items[0].entry_id == dead.entry_id
    assert dl.find_by_job_id(enq.job_id).entry_id == dead.entry_id

    # The records travel with the replay; a panic entry of an older release (written by reclaim.lua, with a
    # delivery count and no record) gets one synthesised.
    assert dl.replay([dead.entry_id]) == 1
    [back] = stream_jobs(redis)
    assert [e["class"] for e in back.errors] == ["WorkerLost", "WorkerLost"]
    second = dl.get(add_dead(redis, back, lua_panic=True))
    assert [(e["class"], e["replays"]) for e in second.errors] == [("WorkerLost", 0)] * 2 + [("WorkerLost", 1)]

    # A history that already ends with this death's record is not extended.
    recorded = dead_job(messages=("lost",), cls="WorkerLost")
    third = dl.get(add_dead(redis, recorded, "panic", error="lost"))
    assert [e["class"] for e in third.errors] == ["WorkerLost"]


# --- acting ------------------------------------------------------------------------


def test_replay_at_a_time_goes_to_the_delayed_set(redis, dl):
    eid = add_dead(redis, dead_job())
    at = now_ms() + 60_000
    assert dl.replay([eid], run_at_ms=at) == 1
    assert redis.xlen(KEYS.stream) == 0 and dl.count() == 0
    [(member, score)] = redis.zrange(KEYS.delayed, 0, -1, withscores=True)
    assert int(score) == at and decode(member).replays == 1
    with pytest.raises(ValueError, match="run_at_ms"):
        dl.replay([eid], run_at_ms=-5)
    with pytest.raises(TypeError, match="wrap a single id"):
        dl.replay(eid)


def test_undecodable_entries_stay(redis, dl):
    bad = add_dead(redis, None, "decode_failed", payload=b"\x00\x01", error_class="DecodeError", error="junk")
    good = add_dead(redis, dead_job())
    assert dl.replay([bad, good]) == 1
    assert [d.entry_id for d in dl.page().items] == [bad]
    progress = []
    assert dl.replay_matching(DLQFilter(reason="decode_failed"), progress=lambda *p: progress.append(p)) == 0
    assert progress[-1] == (1, 1) and dl.count() == 1


def test_discard_by_id(redis, dl):
    ids, _ = bulk_dead(redis, 5)
    assert dl.discard([ids[0], ids[3], ids[0], "1-0"]) == 2
    assert [d.entry_id for d in dl.page().items] == [ids[4], ids[2], ids[1]]
    assert dl.discard([ids[0]]) == 0


def test_concurrent_replays_publish_each_job_once(redis, redis_url, dl):
    entry_ids, job_ids = bulk_dead(redis, 5000)
    barrier = threading.Barrier(2)
    moved = []

    def replay():
        client = connect(redis_url)
        barrier.wait()
        moved.append(DeadLetters(client, Q).replay(entry_ids))
        client.close()

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(moved) == 5000 and len(moved) == 2
    counts = Counter(job.id for job in stream_jobs(redis))
    assert set(counts) == set(job_ids) and set(counts.values()) == {1}
    assert dl.count() == 0


def test_replay_matching_100k_in_chunks(redis, dl):
    bulk_dead(redis, 100_000)
    others, _ = bulk_dead(redis, 1000, task="reports.build")
    f = DLQFilter(task="emails.send")
    progress, late = [], []

    def on_progress(done, total):
        progress.append((done, total))
        if not late:  # a job that dies while the sweep runs is left alone
            late.append(add_dead(redis, dead_job()))

    assert dl.replay_matching(f, progress=on_progress) == 100_000
    assert progress[0] == (0, 100_000) and progress[-1] == (100_000, 100_000)
    assert len(progress) >= 100_000 // 500
    assert all(a[0] <= b[0] for a, b in zip(progress, progress[1:], strict=False))
    assert redis.xlen(KEYS.stream) == 100_000
    assert dl.count() == 1001
    assert {d.entry_id for d in dl.page(limit=1001).items} == set(others) | set(late)
    first = decode(redis.xrange(KEYS.stream, count=1)[0][1][b"j"])
    assert (first.attempt, first.replays, first.errors[0]["message"]) == (0, 1, "row 0 failed")


def test_sweeps_stop_when_asked_and_discard_matching(redis, dl):
    ids, _ = bulk_dead(redis, 2000)
    progress = []
    moved = dl.replay_matching(DLQFilter(), chunk=500, progress=lambda *p: progress.append(p),
                               should_stop=lambda: len(progress) >= 2)
    assert moved == 500 and progress == [(0, 2000), (500, 2000)]
    assert [d.entry_id for d in dl.page(limit=2000).items] == ids[500:][::-1]
    assert redis.xlen(KEYS.stream) == 500

    unknown = [add_dead(redis, dead_job("gone.task", messages=()), "unknown_task", error_class="UnknownTask",
                        error="no task named 'gone.task'") for _ in range(30)]
    f = DLQFilter(reason="unknown_task")
    assert dl.count_matching(f) == 30
    progress.clear()
    assert dl.discard_matching(f, chunk=100, progress=lambda *p: progress.append(p)) == 30
    assert progress == [(0, 30), (30, 30)]  # through the index: one step for the 30, not a pass over 1,530
    assert dl.count_matching(f) == 0 and dl.count() == 1500
    assert dl.discard(unknown) == 0
    assert dl.discard_matching(DLQFilter(until_ms=1)) == 0 and dl.count() == 1500
    assert dl.discard_matching(DLQFilter()) == 1500 and dl.count() == 0


def test_count_matching_time_ranges(redis, dl):
    t0 = 1_700_000_000_000
    for i in range(2500):
        redis.xadd(KEYS.dlq, fields_for(dead_job()), id=f"{t0 + i}-0")
    assert dl.count_matching(DLQFilter()) == 2500
    assert dl.count_matching(DLQFilter(since_ms=t0 - 5, until_ms=t0 + 10_000)) == 2500
    assert dl.count_matching(DLQFilter(since_ms=t0 + 100, until_ms=t0 + 2200)) == 2100
    assert dl.count_matching(DLQFilter(since_ms=t0 + 2499)) == 1
    assert dl.count_matching(DLQFilter(until_ms=t0)) == 0
    page = dl.page(filter=DLQFilter(since_ms=t0 + 100, until_ms=t0 + 2200), limit=10)
    assert page.items[0].dead_at_ms == t0 + 2199 and page.next_cursor == f"{t0 + 2190}-0"


def test_client_must_return_bytes(redis_url):
    import redis as redis_lib

    with pytest.raises(ValueError, match="decode_responses=False"):
        DeadLetters(redis_lib.Redis.from_url(redis_url, decode_responses=True), Q)


def test_filter_by_fingerprint_acts_on_one_error_group(redis):
    pipe = redis.pipeline()
    for i in range(30):
        job = Job(id=f"job-{i}", task="t", args=[i])
        message = f"user {i} not found" if i % 3 else f"timeout after {i} s"
        pipe.xadd(QueueKeys.for_queue("fp").dlq, {"j": job.encode(), "reason": "retries_exhausted", "task": "t",
                                                   "job_id": job.id, "source_id": "1-0", "error_class": "LookupError",
                                                   "error": message})
    pipe.execute()
    dead = DeadLetters(redis, "fp")
    [biggest, *_] = dead.groups()
    assert biggest.count == 20 and biggest.fingerprint == fingerprint("LookupError", "user 7 not found")
    only = DLQFilter(fingerprint=biggest.fingerprint)
    assert dead.count_matching(only) == 20
    assert DLQFilter.from_dict(only.to_dict()) == only
    assert dead.discard_matching(only) == 20
    assert dead.count() == 10
