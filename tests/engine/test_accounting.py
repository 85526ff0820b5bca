"""Every job accounted for: delivery identity, crash charges, liveness, pickup rules and timeouts.

Each test here failed on the worker as it was before deliveries were named by
(queue, entry id), crashes were charged from the start journal and liveness
was judged by alive keys. Dead workers are played by "ghost" consumers: a
plain client that reads entries (XREADGROUP) and, for a run under way, writes
the start journal as a worker does, then never answers again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import suppress
from functools import partial

import pytest

from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.dlq.entries import decode_entry
from chasqui_core.engine.jobs.envelope import Job, decode, error_record, new_job_id, now_ms
from chasqui_core.engine.jobs.errors import RetryAfter
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.recovery.reclaim import Leases, add_death_record
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RetryPolicy, decide
from tests.engine.worker_app import wait_for
from tests.helpers import reclaim_now, worker_running


running = partial(worker_running, promoter_poll_interval=0.05)
"""A real worker on its own thread and loop for the block's length (tests/helpers.py)."""


def recorder():
    """A registry whose tasks record each run: (task, job id, attempt)."""
    runs: list[tuple[str, str, int]] = []
    registry = HandlerRegistry()

    def make(name, fail=False):
        def handler(ctx, *args):
            runs.append((name, ctx.job.id, ctx.attempt))
            if fail:
                raise ValueError(f"{name} fails")
        registry.register(name, handler, takes_context=True)

    return runs, registry, make


def payload(queue: str, task: str, **options) -> bytes:
    return Queue(queue, url="redis://unused").build(JobSpec(task, **options)).payload


def pending(redis, keys: QueueKeys) -> int:
    try:
        return int(redis.xpending(keys.stream, GROUP)["pending"])
    except Exception:
        return 0


def ghost_reads(redis, keys: QueueKeys, ghost: str, count: int = 100, *, running: int = 0,
                dispatching: int = 0) -> list[bytes]:
    """A consumer that reads entries and dies; the first ``running`` of them it had started (journal written), the
    next ``dispatching`` it was about to start (named in its round's set, but not marked running)."""
    with suppress(Exception):
        redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    reply = redis.xreadgroup(GROUP, ghost, {keys.stream: ">"}, count=count)
    ids = [entry_id for _, entries in reply for entry_id, _ in entries]
    for entry_id in ids[:running]:
        redis.hset(keys.running(ghost), entry_id, now_ms() - 500)
    if dispatching:
        redis.sadd(keys.dispatching(ghost), *ids[running:running + dispatching])
    return ids


def bury(redis, keys: QueueKeys, ghost: str) -> None:
    """Record the ghost's death, as the supervisor of a process that ended does: its lost runs are deaths."""
    add_death_record(redis, keys, ghost, "killed by signal 9", now_ms())


def dlq(redis, keys: QueueKeys) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in redis.xrange(keys.dlq)]


def envelope(entry: dict[bytes, bytes]) -> Job:
    """A dead job's envelope as the DLQ's readers see it: its last error's class and message are the entry's."""
    dead = decode_entry("", "0-0", entry)
    assert dead.job is not None
    return dead.job


# --- 1. delivery identity ---------------------------------------------------------------------------------


def test_two_queues_holding_the_same_entry_ids_both_run_at_first_delivery(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    a, b = QueueKeys.for_queue("same-a"), QueueKeys.for_queue("same-b")
    for keys in (a, b):
        for seq in range(1, 6):
            redis.xadd(keys.stream, {"j": payload(keys.queue, "t")}, id=f"1-{seq}")
    with running(redis_url, ["same-a", "same-b"], registry, visibility_timeout_ms=30_000):
        # far sooner than any reclaim pass (visibility 30 s): each entry ran on its first delivery
        wait_for(lambda: len(runs) == 10, 10, "all ten jobs to run")
        wait_for(lambda: pending(redis, a) == pending(redis, b) == 0, 5, "nothing left pending")
        assert redis.xlen(a.stream) == redis.xlen(b.stream) == 0
    assert len({job_id for _, job_id, _ in runs}) == 10
    assert dlq(redis, a) == dlq(redis, b) == []


def test_two_reclaimed_entries_sharing_an_id_both_run_uncharged(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    a, b = QueueKeys.for_queue("reclaim-a"), QueueKeys.for_queue("reclaim-b")
    for keys in (a, b):
        redis.xadd(keys.stream, {"j": payload(keys.queue, "t")}, id="1-1")
        ghost_reads(redis, keys, "ghost")  # fetched, never started
    time.sleep(0.3)
    with running(redis_url, ["reclaim-a", "reclaim-b"], registry, visibility_timeout_ms=250):
        wait_for(lambda: len(runs) == 2, 10, "both reclaimed jobs to run")
        wait_for(lambda: pending(redis, a) == pending(redis, b) == 0, 5, "nothing left pending")
    assert sorted(attempt for _, _, attempt in runs) == [1, 1], "never started: not charged"
    assert dlq(redis, a) == dlq(redis, b) == []


# --- 2. crash charges --------------------------------------------------------------------------------------


def test_a_lost_run_on_a_budget_of_one_is_dead_lettered_not_run_again(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("budget-1")
    job_id = Queue(keys.queue, redis_client=redis).add("t", attempts=1).job_id
    ghost_reads(redis, keys, "ghost", running=1)
    bury(redis, keys, "ghost")
    time.sleep(0.3)
    with running(redis_url, [keys.queue], registry, visibility_timeout_ms=250):
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 10, "the job to be dead-lettered")
    assert runs == [], "its one run was the lost one"
    [entry] = dlq(redis, keys)
    assert (entry[b"reason"], entry[b"error_class"], entry[b"job_id"].decode()) == (
        b"retries_exhausted", b"WorkerLost", job_id)
    job = envelope(entry)
    assert (job.attempt, job.deaths) == (1, 1)
    [lost] = job.errors
    assert (lost["attempt"], lost["class"], lost["worker"]) == (1, "WorkerLost", "ghost")
    assert "worker lost" in lost["message"] and lost["finished_at"] >= lost["started_at"] > 0


def test_two_failures_then_a_lost_run_spend_a_budget_of_three(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("budget-3")
    errors = [error_record(attempt=n, exc_class="ValueError", message="no", traceback="", worker="w",
                           started_at=1, finished_at=2, backoff_ms=0) for n in (1, 2)]
    job = Job(new_job_id(), "t", [], {}, attempt=2, created_at=now_ms(), max_attempts=3, errors=errors)
    redis.xadd(keys.stream, {"j": job.encode()})
    ghost_reads(redis, keys, "ghost", running=1)
    bury(redis, keys, "ghost")
    time.sleep(0.3)
    with running(redis_url, [keys.queue], registry, visibility_timeout_ms=250):
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 10, "the job to be dead-lettered")
    assert runs == [], "a fourth run would exceed the budget of three"
    [entry] = dlq(redis, keys)
    assert entry[b"reason"] == b"retries_exhausted"
    assert [e["class"] for e in envelope(entry).errors] == ["ValueError", "ValueError", "WorkerLost"]


def test_only_the_jobs_a_dead_worker_was_running_are_charged(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("charged")
    q = Queue(keys.queue, redis_client=redis)
    ids = [q.add("t").job_id for _ in range(6)]
    ghost_reads(redis, keys, "ghost", running=1)  # it had started the first of the six it fetched
    bury(redis, keys, "ghost")
    time.sleep(0.3)
    with running(redis_url, [keys.queue], registry, visibility_timeout_ms=250):
        wait_for(lambda: len(runs) == 6, 10, "all six jobs to run")
        wait_for(lambda: pending(redis, keys) == 0, 5, "nothing left pending")
    attempts = {job_id: attempt for _, job_id, attempt in runs}
    assert attempts == {ids[0]: 2, **{job_id: 1 for job_id in ids[1:]}}
    assert redis.hlen(keys.running("ghost")) == 0, "the dead worker's journal is emptied as it is reclaimed"
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.totals).items()}
    assert (totals["lost"], totals["recovered"], totals["completed"]) == (1, 5, 6)


def test_a_live_worker_keeps_its_entries_however_long_they_sit_idle(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("alive")
    Queue(keys.queue, redis_client=redis).add("t")
    ghost_reads(redis, keys, "busy", running=1)
    redis.set(keys.alive("busy"), "1", px=60_000)  # its lease pass ran: it lives, only slowly
    with running(redis_url, [keys.queue], registry, visibility_timeout_ms=200):
        time.sleep(1.5)  # seven visibility timeouts
        assert runs == [] and pending(redis, keys) == 1, "a live worker's job was taken over"
        redis.delete(keys.alive("busy"))  # now it is gone
        wait_for(lambda: len(runs) == 1, 10, "the job to be reclaimed once its worker died")
    assert runs[0][2] == 2


def test_a_crash_loop_becomes_a_panic_after_two_deaths_and_the_job_never_runs_again(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("panic")
    Queue(keys.queue, redis_client=redis).add("t", attempts=5)
    for ghost in ("ghost-1", "ghost-2"):
        ghost_reads(redis, keys, ghost, running=1)
        bury(redis, keys, ghost)
        time.sleep(0.3)
        [moved] = reclaim_now(redis_url, keys, min_idle_ms=250)
        assert moved.charged and moved.died
    with running(redis_url, [keys.queue], registry, visibility_timeout_ms=250):
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 10, "the poison pill to be dead-lettered")
    assert runs == []
    [entry] = dlq(redis, keys)
    assert entry[b"reason"] == b"panic"
    assert [e["worker"] for e in envelope(entry).errors] == ["ghost-1", "ghost-2"]


def test_runs_of_a_worker_that_only_lost_contact_are_charged_runs_but_never_deaths(redis, redis_url):
    """Two workers cut off while running the job, neither known dead: no panic, two runs on its budget."""
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("contact")
    job_id = Queue(keys.queue, redis_client=redis).add("t", attempts=5).job_id
    for ghost in ("cut-1", "cut-2"):
        ghost_reads(redis, keys, ghost, running=1)  # no death on record: its process may live on
        time.sleep(0.3)
        [moved] = reclaim_now(redis_url, keys, min_idle_ms=250)
        assert moved.charged and not moved.died
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: runs, 10, "the job to run")
    assert runs == [("t", job_id, 3)] and redis.xlen(keys.dlq) == 0
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.totals).items()}
    assert (totals["lost_contact"], totals.get("lost", 0), totals.get("recovered", 0)) == (2, 0, 0)


def test_a_lease_pass_tells_entries_settled_meanwhile_from_entries_taken_back(redis, redis_url):
    """Only an entry a reclaim took back is reported: one the worker settled itself since is not."""
    keys = QueueKeys.for_queue("lease")
    q = Queue(keys.queue, redis_client=redis)
    for _ in range(3):
        q.add("t")
    settled_id, taken_id, kept_id = ghost_reads(redis, keys, "slow", running=3)
    redis.xack(keys.stream, GROUP, settled_id)  # what settle.lua does once the outcome is flushed
    redis.xdel(keys.stream, settled_id)
    time.sleep(0.3)
    redis.set(keys.alive("slow"), "1", px=60_000)
    redis.xclaim(keys.stream, GROUP, "slow", 0, [kept_id], justid=True)
    redis.delete(keys.alive("slow"))  # silent past its visibility timeout: the reclaim takes what is idle
    [moved] = reclaim_now(redis_url, keys, min_idle_ms=250)
    assert moved.entry_id == taken_id

    async def lease_pass():
        client = aconnect(redis_url)
        try:
            leases = Leases(Scripts(client), "slow", 10_000)
            first = await leases.keep(keys, [settled_id, taken_id, kept_id])
            again = await leases.keep(keys, [kept_id])
            return first, again
        finally:
            await client.aclose()

    first, again = asyncio.run(lease_pass())
    assert first.lost == [taken_id] and again.lost == []
    assert redis.xpending_range(keys.stream, GROUP, "-", "+", 10)[0]["message_id"] == kept_id


# --- 5. pickup rules and small gaps --------------------------------------------------------------------------


def test_envelopes_no_producer_wrote_are_dead_lettered_as_invalid(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("invalid")
    spent = Job(new_job_id(), "t", [], {}, attempt=3, created_at=now_ms(), max_attempts=3)
    future = Job(new_job_id(), "t", [], {}, created_at=now_ms() + 10 * 24 * 3600 * 1000)
    for job in (spent, future):
        redis.xadd(keys.stream, {"j": job.encode()})
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: redis.xlen(keys.dlq) == 2, 10, "both to be dead-lettered")
    assert runs == []
    reasons = {decode(e[b"j"]).id: (e[b"reason"], e[b"error"].decode()) for e in dlq(redis, keys)}
    assert reasons[spent.id][0] == reasons[future.id][0] == b"invalid"
    assert "3 runs were made, and its error history records 0" in reasons[spent.id][1]
    assert "ahead of this worker's clock" in reasons[future.id][1]
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.totals).items()}
    assert (totals["dlq"], totals["dlq:invalid"], totals["fetched"]) == (2, 2, 2)


def test_a_retry_past_a_lowered_budget_is_retries_exhausted_not_invalid(redis, redis_url):
    """A deploy lowers a task's max_attempts while its retries wait: they were written honestly."""
    runs: list[int] = []

    def release(budget: int) -> HandlerRegistry:
        registry = HandlerRegistry()

        def t(ctx):
            runs.append(ctx.attempt)
            raise ValueError("t fails")
        registry.register("t", t, takes_context=True, max_attempts=budget,
                          backoff=BackoffSpec(initial_ms=100, multiplier=20, jitter="none"))  # 0.1 s, then 2 s
        return registry

    keys = QueueKeys.for_queue("lowered")
    job_id = Queue(keys.queue, redis_client=redis).add("t").job_id
    with running(redis_url, [keys.queue], release(5)):
        wait_for(lambda: len(runs) == 2, 20, "two failed runs")
        wait_for(lambda: redis.zcard(keys.delayed) == 1 and not pending(redis, keys), 10, "the retry to wait")
    [waiting] = redis.zrange(keys.delayed, 0, 0)
    assert decode(waiting).attempt == 2
    with running(redis_url, [keys.queue], release(2)):  # the new release's budget
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 10, "the retry to be dead-lettered")
    assert len(runs) == 2, "a run past the new budget was made"
    [entry] = dlq(redis, keys)
    assert (entry[b"reason"], entry[b"job_id"].decode(), entry[b"error_class"]) == (
        b"retries_exhausted", job_id, b"ValueError")
    assert b"budget is now 2 runs and it has made 2" in entry[b"error"]
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.totals).items()}
    assert totals.get("dlq:invalid", 0) == 0 and totals["dlq:retries_exhausted"] == 1


def test_an_envelope_counting_runs_its_history_does_not_record_is_invalid_within_its_budget(redis, redis_url):
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("forged")
    forged = Job(new_job_id(), "t", [], {}, attempt=1, created_at=now_ms(), max_attempts=3)
    redis.xadd(keys.stream, {"j": forged.encode()})
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 10, "the job to be dead-lettered")
    assert runs == []
    [entry] = dlq(redis, keys)
    assert entry[b"reason"] == b"invalid" and b"records 0" in entry[b"error"]


@pytest.mark.parametrize("strategy", ["exponential", "fixed", "linear", "retry_after"])
def test_a_retry_after_hint_is_honoured_whatever_the_backoff_strategy(strategy):
    job = Job(new_job_id(), "t", attempt=0, backoff=BackoffSpec(strategy=strategy).to_dict())
    decision = decide(job, RetryAfter(7.5), 1, None, RetryPolicy())
    assert (decision.retry, decision.delay_ms) == (True, 7500)


# --- 4. timeouts ---------------------------------------------------------------------------------------------


def test_an_async_job_past_its_timeout_is_cancelled_charged_and_retried_by_its_budget(redis, redis_url):
    starts = []
    registry = HandlerRegistry()

    async def hang(ctx):
        starts.append(ctx.attempt)
        await asyncio.sleep(3600)

    registry.register("hang", hang, takes_context=True, timeout=0.3, max_attempts=2, backoff=0)
    keys = QueueKeys.for_queue("timeout-async")
    Queue(keys.queue, redis_client=redis).add("hang")
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 15, "the job to run out of time twice")
        assert redis.xlen(keys.stream) == 0
    assert starts == [1, 2]
    [entry] = dlq(redis, keys)
    assert entry[b"reason"] == b"retries_exhausted"
    errors = envelope(entry).errors
    assert [e["class"] for e in errors] == ["chasqui_core.engine.jobs.errors.JobTimeout"] * 2
    assert all(250 <= e["duration_ms"] < 5000 for e in errors)


def test_a_sync_job_past_its_timeout_is_charged_and_its_thread_replaced(redis, redis_url):
    release = threading.Event()
    done = []
    registry = HandlerRegistry()

    def hang():
        release.wait(60)

    registry.register("hang", hang, timeout=0.3, max_attempts=1)
    registry.register("quick", lambda: done.append(1))
    keys = QueueKeys.for_queue("timeout-sync")
    q = Queue(keys.queue, redis_client=redis)
    q.add("hang")
    try:
        with running(redis_url, [keys.queue], registry, concurrency=1) as worker:
            wait_for(lambda: redis.xlen(keys.dlq) == 1, 15, "the hung job to be charged its timeout")
            q.add("quick")  # the only thread is stuck: a replacement runs this
            wait_for(lambda: done == [1], 10, "a job after the hung one")
            # the hung run is not counted as in flight; the quick one stops counting once its outcome is in
            wait_for(lambda: worker.in_flight == 0, 10, "nothing left in flight")
    finally:
        release.set()
    [entry] = dlq(redis, keys)
    assert (entry[b"reason"], entry[b"error_class"]) == (b"retries_exhausted",
                                                         b"chasqui_core.engine.jobs.errors.JobTimeout")
    assert worker.recycle_reason == "", "standalone: the thread is replaced, the process goes on"


def test_a_supervised_worker_makes_way_for_a_fresh_process_when_a_sync_job_hangs(redis, redis_url):
    release = threading.Event()
    registry = HandlerRegistry()
    registry.register("hang", lambda: release.wait(60), timeout=0.3, max_attempts=2)
    keys = QueueKeys.for_queue("timeout-recycle")
    Queue(keys.queue, redis_client=redis).add("hang")
    try:
        with running(redis_url, [keys.queue], registry, supervisor_pid=1) as worker:
            wait_for(lambda: worker.recycle_reason, 15, "the worker to stop itself")
            wait_for(lambda: redis.zcard(keys.delayed) + redis.xlen(keys.stream) == 1, 10, "the retry")
    finally:
        release.set()
    assert "ran past its timeout of 0.3 s" in worker.recycle_reason
    assert worker.unfinished_sync_jobs == 1, "the stuck thread is not waited for"
    [(raw, _)] = redis.zrange(keys.delayed, 0, -1, withscores=True) or [
        (f[b"j"], 0) for _, f in redis.xrange(keys.stream)]
    assert [e["class"] for e in decode(raw).errors] == ["chasqui_core.engine.jobs.errors.JobTimeout"]


def test_a_job_taken_back_from_five_dead_workers_is_a_poison_pill_even_if_none_noted_it_running(redis, redis_url):
    # an async job that kills its process before its first await is never written to the start journal
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("recovered")
    Queue(keys.queue, redis_client=redis).add("t", attempts=10)
    for n in range(5):
        ghost_reads(redis, keys, f"ghost-{n}", dispatching=1)  # died in the round of starts that held it
        bury(redis, keys, f"ghost-{n}")
        time.sleep(0.3)
        [moved] = reclaim_now(redis_url, keys, min_idle_ms=250)
        assert not moved.charged
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: redis.xlen(keys.dlq) == 1, 10, "the job to be dead-lettered")
    assert runs == []
    [entry] = dlq(redis, keys)
    assert entry[b"reason"] == b"panic"
    assert b"taken back from 5 workers" in entry[b"error"]


def test_a_job_only_fetched_by_five_workers_that_died_is_no_poison_pill(redis, redis_url):
    """Crash after crash of other jobs, a job each dead worker had only fetched (never in a round of starts) is not
    counted toward panic: it runs, once, on its first attempt. It used to be counted at every death, and innocent
    jobs read beside crashing ones were dead-lettered as ``panic`` without having run."""
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("only-fetched")
    job_id = Queue(keys.queue, redis_client=redis).add("t").job_id
    for n in range(6):
        ghost_reads(redis, keys, f"crashed-{n}")
        bury(redis, keys, f"crashed-{n}")
        time.sleep(0.3)
        [moved] = reclaim_now(redis_url, keys, min_idle_ms=250)
        assert not moved.charged
    assert [f.get(b"recovered") for _, f in redis.xrange(keys.stream)] == [None]
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: runs, 10, "the job to run")
    assert runs == [("t", job_id, 1)] and redis.xlen(keys.dlq) == 0


def test_a_job_taken_back_from_workers_that_only_lost_contact_is_never_a_poison_pill(redis, redis_url):
    """Every partition past the visibility timeout takes back all a live worker fetched; with no death on record
    those put-backs are not counted toward panic, however many: the job runs, once, on its first attempt."""
    runs, registry, make = recorder()
    make("t")
    keys = QueueKeys.for_queue("cut-off")
    job_id = Queue(keys.queue, redis_client=redis).add("t").job_id
    for n in range(6):
        ghost_reads(redis, keys, f"cut-{n}")  # fetched, not started, and no death on record
        time.sleep(0.3)
        [moved] = reclaim_now(redis_url, keys, min_idle_ms=250)
        assert not moved.charged
    assert [f.get(b"recovered") for _, f in redis.xrange(keys.stream)] == [None]
    with running(redis_url, [keys.queue], registry):
        wait_for(lambda: runs, 10, "the job to run")
    assert runs == [("t", job_id, 1)] and redis.xlen(keys.dlq) == 0
