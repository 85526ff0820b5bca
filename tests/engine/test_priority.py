"""Priorities: three bands per queue, each a stream of its own, read together and started highest first.

Every test runs a real worker on the real server and reads the order the
jobs ran in from the jobs themselves.
"""

from __future__ import annotations

import signal
import time
from functools import partial

import pytest

from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.envelope import pack_job
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.jobs.priority import Inbox, band_of, check_priority
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.worker_app import dlq_entries, read_runs, settled, wait_for
from tests.helpers import worker_running


running = partial(worker_running, concurrency=1)


def recording_registry(*, sync: bool = False, fail_first: bool = False):
    """A task ``job`` that records (its name, attempt) as it starts; optionally failing its first run."""
    order: list[tuple[str, int]] = []
    registry = HandlerRegistry()

    def record(ctx, name):
        order.append((name, ctx.attempt))
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("first run fails")

    if sync:
        registry.register("job", record, takes_context=True)
    else:
        async def handler(ctx, name):
            record(ctx, name)
        registry.register("job", handler, takes_context=True)
    return order, registry


def add(q: Queue, name: str, priority: int = 0, **options):
    return q.add("job", kwargs={"name": name}, priority=priority, **options)


# --- the producer -----------------------------------------------------------------


@pytest.mark.parametrize("priority", [101, -101, 1.5, True, "5"])
def test_a_priority_out_of_range_says_what_a_priority_is(priority):
    with pytest.raises(ValueError, match="priority must be a whole number from -100 to 100"):
        Queue("p", url="redis://unused").build(JobSpec("job", priority=priority))


def test_priority_is_not_a_meta_key_a_caller_sets_by_hand():
    with pytest.raises(ValueError, match="priority="):
        Queue("p", url="redis://unused").build(JobSpec("job", meta={"priority": 5}))


def test_bands():
    assert [band_of(p) for p in (100, 1, 0, -1, -100)] == ["high", "high", "", "low", "low"]
    assert check_priority(-100) == -100


def test_a_prioritised_job_goes_to_its_bands_stream_and_the_band_is_recorded(redis, redis_url):
    q = Queue("p", url=redis_url)
    keys = QueueKeys.for_queue("p")
    add(q, "d")
    high = add(q, "h", 10)
    add(q, "l", -3)
    assert redis.xlen(keys.stream) == 1
    assert redis.xlen(keys.in_band("high").stream) == 1 and redis.xlen(keys.in_band("low").stream) == 1
    assert redis.xrange(keys.in_band("high").stream)[0][0].decode() == high.entry_id
    assert redis.smembers(keys.bands) == {b"high", b"low"}
    # each band's stream has the workers' group from its first job on
    assert [g["name"] for g in redis.xinfo_groups(keys.in_band("low").stream)] == [GROUP.encode()]


# --- the worker ---------------------------------------------------------------------


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_strict_mode_starts_every_higher_job_first(redis, redis_url, sync):
    order, registry = recording_registry(sync=sync)
    q = Queue("p", url=redis_url)
    for i in range(5):
        add(q, f"l{i}", -50)
        add(q, f"d{i}")
        add(q, f"h{i}", 50)
    with running(redis_url, ["p"], registry):
        wait_for(lambda: len(order) == 15, 20, "every job to run")
        wait_for(lambda: settled(redis, "p"), 10, "every band to settle")
    bands = [name[0] for name, _ in order]
    assert bands == ["h"] * 5 + ["d"] * 5 + ["l"] * 5
    assert [name for name, _ in order] == [f"{b}{i}" for b in "hdl" for i in range(5)], "a band keeps its order"


def test_weighted_mode_gives_every_band_its_share(redis, redis_url):
    order, registry = recording_registry()
    q = Queue("p", url=redis_url)
    for i in range(30):
        add(q, f"l{i}", -1)
        add(q, f"d{i}")
        add(q, f"h{i}", 1)
    with running(redis_url, ["p"], registry, priority_mode="weighted", batch_size=100):
        wait_for(lambda: len(order) == 90, 20, "every job to run")
    first = [name[0] for name, _ in order[:20]]
    assert first.count("h") == 12 and first.count("d") == 6 and first.count("l") == 2, first
    assert "l" in first[:10], "low priority waited a whole round"


def test_a_band_added_while_the_worker_runs_is_read(redis, redis_url):
    order, registry = recording_registry()
    q = Queue("p", url=redis_url)
    with running(redis_url, ["p"], registry):
        add(q, "d")
        wait_for(lambda: len(order) == 1, 10, "the default job")
        add(q, "h", 7)
        add(q, "l", -7)
        wait_for(lambda: len(order) == 3, 10, "the first jobs of two new bands")
        wait_for(lambda: settled(redis, "p"), 10, "every band to settle")


def test_a_retry_and_a_delayed_job_keep_their_band(redis, redis_url):
    order, registry = recording_registry(fail_first=True)
    q = Queue("p", url=redis_url)
    keys = QueueKeys.for_queue("p")
    with running(redis_url, ["p"], registry, policy=None):
        add(q, "h", 20, backoff=10)
        add(q, "later", -20, delay=50)
        wait_for(lambda: sorted(order) == [("h", 1), ("h", 2), ("later", 1), ("later", 2)], 20, "the retries")
        wait_for(lambda: settled(redis, "p"), 10, "every band to settle")
    assert redis.xlen(keys.stream) == 0 and not redis.xinfo_groups(keys.stream)[0]["entries-read"]
    high, low = keys.in_band("high").stream, keys.in_band("low").stream
    assert redis.xinfo_groups(high)[0]["entries-read"] == 2, "the retry went back to the high band"
    assert redis.xinfo_groups(low)[0]["entries-read"] == 2, "the promoted job and its retry went to the low band"


def test_a_replayed_job_goes_back_to_its_band(redis, redis_url):
    registry = HandlerRegistry()

    def fail(**_):
        raise RuntimeError("always")

    registry.register("job", fail)
    q = Queue("p", url=redis_url)
    keys = QueueKeys.for_queue("p")
    job = q.add("job", priority=-9, attempts=1)
    with running(redis_url, ["p"], registry):
        wait_for(lambda: dlq_entries(redis, "p"), 10, "the job to die")
    entry_id = redis.xrange(keys.dlq)[0][0].decode()
    assert DeadLetters(redis, "p").replay([entry_id]) == 1
    [(_, fields)] = redis.xrange(keys.in_band("low").stream)
    assert job.job_id.encode() in fields[b"j"]
    assert redis.xlen(keys.stream) == 0


def test_entries_with_the_same_id_in_two_bands_each_run_and_settle(redis, redis_url):
    """Stream ids repeat across streams: the worker tells the deliveries apart by stream."""
    order, registry = recording_registry()
    keys = QueueKeys.for_queue("p")
    Queue("p", url=redis_url).add("job", kwargs={"name": "made the high band"}, priority=1)
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    for stream, name in ((keys.stream, "default"), (keys.in_band("high").stream, "high")):
        redis.xadd(stream, {"j": pack_job(f"job-{name}", "job", [], {"name": name}, int(time.time() * 1000), None,
                                          None, 0, {})}, id="9999999999999-1")
    with running(redis_url, ["p"], registry, concurrency=4):
        wait_for(lambda: len(order) == 3, 10, "every job")
        wait_for(lambda: settled(redis, "p"), 10, "both entries of the same id to settle")
    assert sorted(name for name, _ in order) == ["default", "high", "made the high band"]


@pytest.mark.timeout(90)
def test_a_high_job_of_a_killed_worker_is_reclaimed_and_charged(redis, workers):
    """The start journal is per band: the lost run of a high job is charged once, by another worker."""
    visibility_s = 2.0
    procs = [workers.start("p-kill", visibility_ms=int(visibility_s * 1000)) for _ in range(2)]
    workers.wait_ready(redis, "p-kill", 2)
    job = Queue("p-kill", redis_client=redis).add("block", kwargs={"seconds": 3}, priority=5)

    [first] = wait_for(lambda: read_runs(redis), 20, "the job to start")
    [victim] = [p for p in procs if p.pid == first.pid]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    wait_for(lambda: len(read_runs(redis)) >= 2, visibility_s + 20, "the job to run again")
    rerun = read_runs(redis)[1]
    assert rerun.job_id == job.job_id and rerun.pid != victim.pid
    assert rerun.attempt == 2, "the run lost with the dead worker is charged"
    wait_for(lambda: settled(redis, "p-kill"), 15, "the queue to settle")
    assert dlq_entries(redis, "p-kill") == []


def test_the_inbox_takes_the_highest_line_first_and_weighted_takes_turns():
    class D:
        def __init__(self, rank):
            self.keys = QueueKeys.for_queue("p").in_band(("high", "", "low")[rank])

    inbox = Inbox()
    for rank in (2, 1, 0, 2, 1, 0):
        inbox.append(D(rank))
    assert [inbox.popleft().keys.rank for _ in range(6)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(IndexError):
        inbox.popleft()
    weighted = Inbox("weighted")
    for rank in (0, 1, 2) * 10:
        weighted.append(D(rank))
    taken = [weighted.popleft().keys.rank for _ in range(10)]
    assert (taken.count(0), taken.count(1), taken.count(2)) == (6, 3, 1)
    with pytest.raises(ValueError, match="'strict' or 'weighted'"):
        Inbox("fair")


def test_a_concurrency_limit_holds_for_entries_with_the_same_id_in_two_bands(redis, redis_url):
    """A limit's slots are named by stream id and band: two runs of one id in two bands hold two slots."""
    import asyncio

    spans: list[tuple[str, float, float]] = []
    registry = HandlerRegistry()

    async def job(name):
        start = time.monotonic()
        await asyncio.sleep(0 if name == "made the high band" else 0.6)
        spans.append((name, start, time.monotonic()))

    registry.register("job", job)
    keys = QueueKeys.for_queue("p")
    q = Queue("p", url=redis_url)
    q.add("job", kwargs={"name": "made the high band"}, priority=1)
    with running(redis_url, ["p"], registry, concurrency=4, limits={"job": {"concurrency": 2}}):
        wait_for(lambda: len(spans) == 1, 10, "the high band's first job")
        for stream, name in ((keys.stream, "default"), (keys.in_band("high").stream, "high")):
            redis.xadd(stream, {"j": pack_job(f"job-{name}", "job", [], {"name": name}, int(time.time() * 1000),
                                              None, None, 0, {})}, id="9999999999999-1")
        time.sleep(0.2)  # both run now, in two slots
        q.add("job", kwargs={"name": "later"})
        wait_for(lambda: len(spans) == 4, 20, "every job")
    edges = sorted([(s[1], 1) for s in spans] + [(s[2], -1) for s in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    assert most == 2, "a third ran beside the two: the two same-id runs held one slot"
