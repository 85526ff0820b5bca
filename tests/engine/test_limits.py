"""Rate and concurrency limits: held across worker processes, from the jobs' own start and end times.

Every test runs real workers on the real server; none reads the limit's
Redis keys to decide whether it held: the jobs' spans (``worker_app.span``)
say what ran when.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from contextlib import suppress
from functools import partial

import pytest

from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.jobs.envelope import Job, decode, new_job_id, now_ms
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.ops.lookup import find_job
from chasqui_core.engine.worker.limits import (Limit, LimitError, LimitGate, Limits, bucket_name, parse_limits,
                                               parse_rate)
from chasqui_core.engine.worker.delivery import Delivery, ref_of
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import Handler, HandlerRegistry
from chasqui_core.engine.store.scripts import Scripts
from tests.engine.worker_app import most_at_once, read_runs, read_spans, wait_for
from tests.helpers import worker_running

# --- the setting -------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("20/s", (20, 1000)), ("100/m", (100, 60_000)), ("5/10s", (5, 10_000)), ("1000/hour", (1000, 3_600_000)),
    (" 3 / 2 min ", (3, 120_000)),
])
def test_rates_read_as_jobs_per_window(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["20", "0/s", "20/0s", "20/d", "-1/s", 20, None, "twenty/s"])
def test_a_rate_that_cannot_be_read_says_how_to_write_one(text):
    with pytest.raises(LimitError, match="must read like '20/s'"):
        parse_rate(text)


@pytest.mark.parametrize(("spec", "message"), [
    ({}, "limits nothing"),
    ({"rate": "2/s", "burst": 3}, "unknown settings \\['burst'\\]"),
    ({"concurrency": 0}, "limits nothing"),
    ({"concurrency": -2}, "whole number of 1 or more"),
    ({"concurrency": True}, "whole number of 1 or more"),
    ({"rate": "2/s", "key": "not a name"}, "keyword argument"),
    ("2/s", "must be a dict"),
])
def test_a_wrong_limit_says_what_is_wrong(spec, message):
    with pytest.raises(LimitError, match=message):
        parse_limits({"emails": spec})


def test_a_limit_named_like_a_queue_of_the_worker_holds_for_that_queue_else_for_a_task():
    limits = Limits(parse_limits({"emails": {"rate": "1/s"}, "app.send": {"concurrency": 1}}), ["emails"])
    assert set(limits.by_queue) == {"emails"} and set(limits.by_task) == {"app.send"}
    job = Queue("emails", url="redis://unused").build(JobSpec("app.send")).payload
    from chasqui_core.engine.jobs.envelope import decode

    buckets = limits.buckets(QueueKeys.for_queue("emails"), decode(job))
    assert [b[0] for b in buckets] == ["{chasqui:emails}:limit:emails:all:", "{chasqui:emails}:limit:app.send:all:"]
    assert limits.buckets(QueueKeys.for_queue("other"), decode(job).__class__(id="x", task="app.other")) is None


def test_bucket_names_keep_plain_values_and_digest_the_rest():
    assert bucket_name("acme-42") == "acme-42"
    assert bucket_name(42) == "42"
    odd = bucket_name("a b}{:" * 30)
    assert odd.startswith("#") and len(odd) == 21 and bucket_name("a b}{:" * 30) == odd
    assert bucket_name("acme-42\n").startswith("#")  # a trailing newline is not plain
    assert Limit.parse("x", {"rate": "1/s", "concurrency": 2, "key": "customer"}).describe() == \
        "1 per 1 s, 2 at once per customer"


# --- one worker, in this process -------------------------------------------------------------


running = partial(worker_running, concurrency=8)


def timed_registry():
    """Tasks that record (task, job id, attempt, start, end) for each run."""
    spans: list[tuple[str, str, int, float, float]] = []
    registry = HandlerRegistry()
    import asyncio

    def make(name):
        async def handler(ctx, seconds=0.0, block=0.0, **_):
            start = time.monotonic()
            time.sleep(block)  # holds the event loop: the jobs after it in its round start that much later
            await asyncio.sleep(seconds)
            spans.append((name, ctx.job.id, ctx.attempt, start, time.monotonic()))
        registry.register(name, handler, takes_context=True)

    for name in ("limited", "free"):
        make(name)
    return spans, registry


def overlap(spans) -> int:
    edges = sorted([(s[3], 1) for s in spans] + [(s[4], -1) for s in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_a_concurrency_limit_holds_and_waiting_costs_no_attempt(redis, redis_url):
    spans, registry = timed_registry()
    q = Queue("lim", url=redis_url)
    ids = [q.add("limited", kwargs={"seconds": 0.05}).job_id for _ in range(12)]
    free = [q.add("free", kwargs={"seconds": 0.05}).job_id for _ in range(6)]
    with running(redis_url, ["lim"], registry, limits={"limited": {"concurrency": 2}}):
        wait_for(lambda: len(spans) == 18, 30, "every job to run once")
    limited = [s for s in spans if s[0] == "limited"]
    assert sorted(s[1] for s in limited) == sorted(ids)
    assert overlap(limited) == 2  # two at once, never three
    assert all(s[2] == 1 for s in spans), "waiting on a limit was charged as an attempt"
    assert overlap(spans) > 2, "jobs with no limit waited on it"
    assert sorted(s[1] for s in spans if s[0] == "free") == sorted(free)
    assert int(redis.hget(QueueKeys.for_queue("lim").totals, "deferred") or 0) > 0


def test_a_rate_limit_spaces_the_starts(redis, redis_url):
    spans, registry = timed_registry()
    q = Queue("lim", url=redis_url)
    for _ in range(9):
        q.add("limited")
    with running(redis_url, ["lim"], registry, limits={"lim": {"rate": "3/s"}}):
        wait_for(lambda: len(spans) == 9, 30, "every job to run once")
    starts = sorted(s[3] for s in spans)
    for i in range(len(starts) - 3):  # any four starts span at least a second (a little slack for the clocks)
        assert starts[i + 3] - starts[i] >= 0.95, starts
    assert starts[-1] - starts[0] < 10, "the waiting jobs were not started as soon as the window allowed"


def test_a_job_started_late_behind_its_round_takes_its_rate_token_again(redis, redis_url):
    """Jobs of one round start one after the other, each running until its first ``await``: a job that
    holds the loop for 0.3 s makes the next start 0.3 s after its token was taken, past its grace. Checked
    only when the round was made, that job started on its old token, and the jobs parked behind it were
    due a second after that token: two starts 0.75 s apart under a limit of one a second."""
    spans, registry = timed_registry()
    q = Queue("lim", url=redis_url)
    q.add("limited", kwargs={"block": 0.3})
    for _ in range(3):
        q.add("limited")
    with running(redis_url, ["lim"], registry, limits={"limited": {"rate": "2/s"}}):
        wait_for(lambda: len(spans) == 4, 30, "every job to run once")
    starts = sorted(s[3] for s in spans)
    assert starts[2] - starts[0] >= 0.95, starts
    assert starts[3] - starts[1] >= 0.95, starts  # the late start counted from when it started, not its token


def test_a_limited_job_late_behind_a_busy_worker_starts_once_its_turn_comes(redis, redis_url):
    """A limited job that waited in a busy worker past its token's grace takes its token again when its turn
    comes, and starts on the reply in the worker slot it kept. Put back at the end of the inbox instead, it
    waited there past its new grace too, for as long as other jobs kept coming: it started only once they
    had all been run, holding its concurrency slot all along."""
    spans, registry = timed_registry()
    q = Queue("lim", url=redis_url)
    limited: list[str] = []

    def keep_adding():  # faster than two slots run them: the worker stays busy, its inbox never empty
        for n in range(60):
            q.add("free", kwargs={"seconds": 0.2})
            if n == 5:
                limited.extend(q.add("limited").job_id for _ in range(3))
            time.sleep(1 / 15)

    with running(redis_url, ["lim"], registry, concurrency=2, limits={"limited": {"rate": "100/s"}}):
        adder = threading.Thread(target=keep_adding)
        adder.start()
        adder.join()
        wait_for(lambda: len(spans) == 63, 60, "every job to run once")
    assert sorted(s[1] for s in spans if s[0] == "limited") == sorted(limited)
    last_free = max(s[3] for s in spans if s[0] == "free")
    assert max(s[3] for s in spans if s[0] == "limited") < last_free - 1, "the limited jobs waited for the others"


def test_a_keyed_limit_holds_per_value(redis, redis_url):
    spans, registry = timed_registry()
    q = Queue("lim", url=redis_url)
    jobs = {}
    for customer in ("acme", "globex"):
        for _ in range(4):
            jobs[q.add("limited", kwargs={"seconds": 0.2, "customer": customer}).job_id] = customer
    q.add_bulk([JobSpec("limited", kwargs={"seconds": 0.2}, limit_key="initech") for _ in range(2)])
    with running(redis_url, ["lim"], registry, limits={"limited": {"concurrency": 1, "key": "customer"}}):
        wait_for(lambda: len(spans) == 10, 30, "every job to run once")
    for customer in ("acme", "globex"):
        mine = [s for s in spans if jobs.get(s[1]) == customer]
        assert len(mine) == 4 and overlap(mine) == 1
    assert overlap([s for s in spans if s[1] not in jobs]) == 1
    assert overlap(spans) >= 2, "one customer's limit held up another's jobs"


def test_a_run_that_ends_wakes_a_parked_job_at_once(redis, redis_url):
    """The slot's lapse (the visibility timeout, 30 s here) is only the fallback."""
    spans, registry = timed_registry()
    q = Queue("lim", url=redis_url)
    for _ in range(3):
        q.add("limited", kwargs={"seconds": 0.3})
    began = time.monotonic()
    with running(redis_url, ["lim"], registry, limits={"limited": {"concurrency": 1}}, visibility_timeout_ms=30_000):
        wait_for(lambda: len(spans) == 3, 20, "the parked jobs to be woken")
    assert time.monotonic() - began < 15
    assert overlap(spans) == 1


def test_a_parked_job_is_found_at_its_mark_and_its_mark_follows_it_when_woken(redis, redis_url):
    """limit_take.lua marks the job it defers, limit_release.lua moves the mark with the job it wakes."""
    release = threading.Event()
    registry = HandlerRegistry()
    registry.register("limited", lambda: release.wait(20), is_async=False)
    q = Queue("lim", url=redis_url)
    first = q.add("limited")
    try:
        with running(redis_url, ["lim"], registry, limits={"limited": {"concurrency": 1}},
                     visibility_timeout_ms=60_000):
            wait_for(lambda: find_job(redis, first.job_id, ["lim"]).state == "running", 20, "the first job to run")
            parked = q.add("limited")
            wait_for(lambda: find_job(redis, parked.job_id, ["lim"]).state == "delayed", 20, "the job to be parked")
            found = find_job(redis, parked.job_id, ["lim"])
            assert any("at the job's mark: found" in note for note in found.searched)
            release.set()
    finally:
        release.set()
    # the wake, on its own: a parked member moved to now takes its mark along
    keys = QueueKeys.for_queue("woken")
    job = Job(new_job_id(), "limited", created_at=now_ms())
    prefix = keys.limit("task", "limited")
    redis.zadd(keys.delayed, {job.encode(): now_ms() + 3_600_000})
    redis.zadd(prefix + "parked", {b"1-0 " + job.encode(): now_ms() + 3_600_000})
    redis.zadd(prefix + "running", {"2-0": now_ms() + 3_600_000})
    assert Scripts(redis).limit_release(keys=[keys.delayed], args=[prefix, "2-0"]) == [1, 1]
    assert float(redis.get(keys.delayed_mark(job.id))) == redis.zscore(keys.delayed, job.encode()) <= now_ms()
    assert find_job(redis, job.id, ["woken"]).state == "delayed"


# --- several worker processes ------------------------------------------------------------


def test_limits_hold_across_worker_processes(redis, redis_url, workers):
    limits = json.dumps({"span": {"concurrency": 3}, "span_sync": {"rate": "4/s"}})
    for _ in range(3):
        workers.start("lim", concurrency=4, limits=limits, block_ms=100, poll=0.02)
    workers.wait_ready(redis, "lim", 3)
    q = Queue("lim", url=redis_url)
    q.add_bulk([JobSpec("span", kwargs={"seconds": 0.15, "log": "lim:log"}) for _ in range(24)])
    q.add_bulk([JobSpec("span_sync", kwargs={"seconds": 0.0, "log": "lim:log"}) for _ in range(12)])
    wait_for(lambda: len(read_spans(redis, "lim:log")) == 36, 60, "every job to run")
    spans = read_spans(redis, "lim:log")
    assert len({s.job_id for s in spans}) == 36, "a job ran twice"
    held = [s for s in spans if s.end_ms - s.start_ms >= 100]
    assert len(held) == 24 and most_at_once(held) <= 3
    assert len({s.pid for s in held}) >= 2, "one process ran every job: the limit was not shared"
    starts = sorted(s.start_ms for s in spans if s.end_ms - s.start_ms < 100)
    for i in range(len(starts) - 4):
        assert starts[i + 4] - starts[i] >= 950, starts


def test_a_dead_workers_slots_lapse_after_its_lease(redis, redis_url, workers):
    limits = json.dumps({"lim": {"concurrency": 1}})
    doomed = workers.start("lim", concurrency=2, limits=limits, visibility_ms=1500, block_ms=100, poll=0.02)
    workers.wait_ready(redis, "lim", 1)
    q = Queue("lim", url=redis_url)
    q.add("block", kwargs={"seconds": 8, "log": "lim:log"})
    wait_for(lambda: read_runs(redis, "lim:log"), 20, "the blocking job to start")
    q.add_bulk([JobSpec("span", kwargs={"seconds": 0.0, "log": "lim:log"}) for _ in range(3)])
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    workers.start("lim", concurrency=2, limits=limits, visibility_ms=1500, block_ms=100, poll=0.02)
    wait_for(lambda: len(read_spans(redis, "lim:log")) == 3, 40, "the jobs behind the dead worker's slot")
    wait_for(lambda: len(read_runs(redis, "lim:log")) == 2, 40, "the dead worker's job to run again")


# --- a rate limit holds where jobs start ---------------------------------------------------------------


def test_a_rate_limit_holds_where_jobs_start_not_where_they_are_read(redis, redis_url):
    """Two workers read a rate-limited queue; each job starts after a wait in its worker (behind other runs).

    Each worker does what the run path does before a limited job starts: a
    job that missed its token's grace (``LimitGate.late``) takes it again
    (``retake``) and starts now or waits in the delayed set. The jobs' own
    start times then never put more than N starts in any second.
    """
    rate = 4
    keys = QueueKeys.for_queue("rate-starts")
    q = Queue(keys.queue, redis_client=redis)
    ids = {q.add("limited").job_id for _ in range(20)}
    limits = Limits(parse_limits({keys.queue: {"rate": f"{rate}/s"}}), [keys.queue])
    handler = Handler("limited", lambda: None, is_async=True)
    starts: list[tuple[float, str]] = []
    deadline = time.monotonic() + 60

    async def worker(name: str, seed: int) -> None:
        client = aconnect(redis_url)
        scripts = Scripts(client)
        gate = LimitGate(scripts, 30_000)
        rng = random.Random(seed)
        runs: set[asyncio.Task] = set()

        async def start_later(d: Delivery, wait: float) -> None:
            await asyncio.sleep(wait)  # in the inbox, behind runs under way
            if gate.late(d):
                taken = await gate.retake(keys, [d])
                if not taken.admitted:
                    return  # it waits in the delayed set, and is read again when due
            starts.append((time.time(), d.job.id))
            await client.xack(keys.stream, GROUP, d.entry_id)
            await client.xdel(keys.stream, d.entry_id)

        try:
            while len(starts) < len(ids) and time.monotonic() < deadline:
                await scripts.promote(keys=[keys.delayed, keys.stream, keys.events, keys.promoter_lock],
                                      args=["", 200, keys.metrics, 1000])
                reply = await client.xreadgroup(GROUP, name, {keys.stream: ">"}, count=10, block=50)
                batch = []
                for _, entries in reply or []:
                    for entry_id, fields in entries:
                        job = decode(fields[b"j"])
                        d = Delivery(keys, entry_id, fields[b"j"], job, handler, ref_of(keys.stream, entry_id))
                        d.limits = limits.buckets(keys, job)
                        batch.append(d)
                if batch:
                    for d in (await gate.take(keys, batch)).admitted:
                        task = asyncio.ensure_future(start_later(d, rng.uniform(0, 1.5)))
                        runs.add(task)
                        task.add_done_callback(runs.discard)
            await asyncio.gather(*runs)
        finally:
            await client.aclose()

    async def main() -> None:
        await asyncio.gather(worker("one", 1), worker("two", 2))

    with suppress(Exception):
        redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    asyncio.run(main())
    assert sorted(job_id for _, job_id in starts) == sorted(ids), "a job was lost or started twice"
    times = sorted(at for at, _ in starts)
    crowded = [(round(times[i], 3), round(times[i + rate] - times[i], 3)) for i in range(len(times) - rate)
               if times[i + rate] - times[i] < 0.95]
    assert not crowded, f"{rate + 1} starts within a second (first start, span): {crowded}"


@pytest.mark.timeout(120)
def test_a_rate_limit_holds_where_worker_processes_start_jobs_that_waited_after_their_read(redis, redis_url,
                                                                                          workers):
    """Three worker processes at concurrency 2 read a queue limited to 5 starts a second; each job runs 0.7 s, so
    most admitted jobs wait behind others before they start. A job whose rate token lapsed while it waited
    takes one again before it starts, so no second holds more than 5 starts, async jobs and sync alike."""
    limits = json.dumps({"rate-wired": {"rate": "5/s"}})
    for _ in range(3):
        workers.start("rate-wired", concurrency=2, limits=limits, block_ms=100, poll=0.02)
    workers.wait_ready(redis, "rate-wired", 3)
    q = Queue("rate-wired", url=redis_url)
    q.add_bulk([JobSpec("span" if i % 2 else "span_sync", kwargs={"seconds": 0.7, "log": "rw:log"})
                for i in range(30)])
    wait_for(lambda: len(read_spans(redis, "rw:log")) == 30, 90, "every job to run")
    spans = read_spans(redis, "rw:log")
    assert len({s.job_id for s in spans}) == 30, "a job ran twice"
    assert len({s.pid for s in spans}) >= 2, "several processes started jobs"
    starts = sorted(s.start_ms for s in spans)
    crowded = [(starts[i], starts[i + 5] - starts[i]) for i in range(len(starts) - 5)
               if starts[i + 5] - starts[i] < 950]
    assert not crowded, f"6 starts within a second (first start ms, span ms): {crowded}"


def test_a_job_whose_slot_lapsed_while_it_waited_takes_one_again_before_it_starts(redis, redis_url):
    """Worker one takes the only slot of a concurrency limit of 1 for a job that then waits (behind a suspect
    running alone, say) while the worker is cut off: its renewals fail, the slot's lease lapses and worker two
    takes the slot for its own job. Worker one's next renewal finds its slot gone; its job is late then, and takes
    a slot again before it starts - and waits, since the slot is two's. It used to start beside two's job: the
    soak saw 3 runs at once under a limit of 2 after its network faults."""
    keys = QueueKeys.for_queue("slot-lapse")
    q = Queue(keys.queue, redis_client=redis)
    q.add("limited")
    q.add("limited")
    limits = Limits(parse_limits({keys.queue: {"concurrency": 1}}), [keys.queue])
    handler = Handler("limited", lambda: None, is_async=True)
    with suppress(Exception):
        redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)

    async def main() -> tuple[bool, bool, int]:
        client = aconnect(redis_url)
        try:
            gate = LimitGate(Scripts(client), 1_000)
            reply = await client.xreadgroup(GROUP, "one", {keys.stream: ">"}, count=2)
            ones, twos = [], []
            for (entry_id, fields), into in zip(reply[0][1], (ones, twos), strict=True):
                d = Delivery(keys, entry_id, fields[b"j"], decode(fields[b"j"]), handler,
                             ref_of(keys.stream, entry_id))
                d.limits = limits.buckets(keys, d.job)
                into.append(d)
            [mine], [theirs] = ones, twos
            assert (await gate.take(keys, [mine])).admitted == [mine]
            late_before = gate.late(mine)
            await asyncio.sleep(1.1)  # its lease lapses, no renewal heard
            assert (await gate.take(keys, [theirs])).admitted == [theirs], "the lapsed slot is free for another"
            await gate.renew(client, [mine, theirs], now_ms())
            late_after = gate.late(mine)
            retaken = await gate.retake(keys, [mine])
            return late_before, late_after, len(retaken.admitted)
        finally:
            await client.aclose()

    late_before, late_after, admitted = asyncio.run(main())
    assert not late_before, "a slot just taken is trusted"
    assert late_after, "a slot its renewal found gone makes the job late"
    assert admitted == 0, "taken again, the slot is full: the job waits instead of starting beside the other"
