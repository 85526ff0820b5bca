"""The scheduler against a real Redis: one job per due time, leader failover, misfires, pauses, per-fire retries."""

import asyncio
import time

import pytest

from chasqui_core.engine.timing import scheduler as sched
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.dlq.entries import decode_entry
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import SCHEDULER_LOCK, QueueKeys, schedule_state
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RetryPolicy
from chasqui_core.engine.timing.scheduler import Scheduler, queue_fire
from chasqui_core.engine.timing.schedules import parse_schedule
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.worker.worker import Worker
from tests.helpers import run_until

Q = "timed"
KEYS = QueueKeys.for_queue(Q)
HOUR = 3600 * 1000


def schedule(name="tick", **raw):
    return parse_schedule(name, {"task": "tasks.tick", "queue": Q, **raw})


def stream_job_ids(redis):
    return [decode(fields[b"j"]).id for _, fields in redis.xrange(KEYS.stream)]


def server_now(redis):
    seconds, micros = redis.time()
    return seconds * 1000 + micros // 1000


async def one_tick(redis_url, schedules, holder="leader"):
    """Take the lock and run one tick, as a leader would."""
    client = aconnect(redis_url)
    try:
        runner = Scheduler(client, Scripts(client), schedules, queue_fire(redis_url), holder)
        await runner._acquire_or_renew()
        assert runner.is_leader
        await runner.tick()
        await runner.release()
    finally:
        await client.aclose()


def test_two_schedulers_add_one_job_per_due_time_across_a_leader_failover(redis, redis_url):
    """Two schedulers share a one-second schedule; the leader dies without releasing its lock half-way."""
    s = schedule(every=1, misfire="run_all")

    async def main():
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        clients = [aconnect(redis_url), aconnect(redis_url)]
        a = Scheduler(clients[0], Scripts(clients[0]), [s], queue_fire(redis_url), "a", lock_ttl_ms=600,
                      max_sleep=0.05)
        b = Scheduler(clients[1], Scripts(clients[1]), [s], queue_fire(redis_url), "b", lock_ttl_ms=600,
                      max_sleep=0.05)
        runs = [asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))]
        await asyncio.sleep(3.2)
        leader, follower = (runs[0], runs[1]) if a.is_leader else (runs[1], runs[0])
        leader.cancel()  # dies holding the lock: the follower waits for it to expire, then takes over
        await asyncio.gather(leader, return_exceptions=True)
        await asyncio.sleep(3.2)
        stop_a.set()
        stop_b.set()
        await asyncio.gather(*runs, return_exceptions=True)
        for c in clients:
            await c.aclose()
        return a, b

    a, b = asyncio.run(main())
    ids = stream_job_ids(redis)
    assert len(ids) == len(set(ids)), f"a due time was fired twice: {ids}"
    dues = sorted(int(i.rsplit(":", 1)[1]) for i in ids)
    assert len(dues) >= 4
    assert dues == list(range(dues[0], dues[-1] + 1000, 1000)), f"a due time got no job: {dues}"
    assert all(i.startswith("schedule:tick:") for i in ids)
    assert a.fired_total + b.fired_total >= len(ids)
    assert a.fired_total > 0 and b.fired_total > 0, "the follower took over"
    state = sched.read_states(redis, ["tick"])[0]
    assert state.fired >= len(ids) and state.missed == 0
    assert [r.job_id for r in state.recent][:3] == [s.job_id(d) for d in reversed(dues[-3:])]


@pytest.mark.parametrize("policy, fired, missed", [("skip", 0, 6), ("run_once", 1, 5), ("run_all", 3, 3)])
def test_misfire_policy_after_five_hours_without_a_scheduler(redis, redis_url, policy, fired, missed):
    s = schedule("hourly", every=3600, misfire=policy, grace=0, catch_up=3)
    asyncio.run(one_tick(redis_url, [s]))  # the first look only computes the next due time
    assert stream_job_ids(redis) == []
    now = server_now(redis)
    this_hour = now // HOUR * HOUR
    redis.hset(schedule_state("hourly"), "next", this_hour - 5 * HOUR)  # as if nothing ran for five hours

    asyncio.run(one_tick(redis_url, [s]))

    ids = stream_job_ids(redis)
    expected = [s.job_id(this_hour - i * HOUR) for i in range(fired - 1, -1, -1)]
    assert ids == expected
    state = sched.read_states(redis, ["hourly"])[0]
    assert (state.fired, state.missed, state.next_due) == (fired, missed, this_hour + HOUR)
    assert all(r.how == "catch_up" for r in state.recent)
    asyncio.run(one_tick(redis_url, [s]))  # looking again fires nothing more
    assert stream_job_ids(redis) == expected


def test_a_changed_timing_starts_afresh_and_a_paused_schedule_skips_its_due_times(redis, redis_url):
    s = schedule("hourly", every=3600)
    now = server_now(redis)
    this_hour = now // HOUR * HOUR
    redis.hset(schedule_state("hourly"), mapping={"next": this_hour - 2 * HOUR, "version": "other-timing"})
    asyncio.run(one_tick(redis_url, [s]))
    assert stream_job_ids(redis) == []  # not caught up: the old timing's due times do not count
    assert sched.read_states(redis, ["hourly"])[0].next_due == this_hour + HOUR

    redis.hset(schedule_state("hourly"), "next", this_hour)  # due now
    assert sched.set_paused(redis, "hourly", "vera") is True
    assert sched.set_paused(redis, "hourly", "vera") is False
    asyncio.run(one_tick(redis_url, [s]))
    state = sched.read_states(redis, ["hourly"])[0]
    assert stream_job_ids(redis) == []
    assert (state.next_due, state.missed, state.paused["by"]) == (this_hour + HOUR, 0, "vera")

    assert sched.set_paused(redis, "hourly", None) is True
    redis.hset(schedule_state("hourly"), "next", this_hour)
    lenient = schedule("hourly", every=3600, grace=3600)  # same timing: 'this hour' counts as on time
    asyncio.run(one_tick(redis_url, [lenient]))
    assert stream_job_ids(redis) == [s.job_id(this_hour)]
    state = sched.read_states(redis, ["hourly"])[0]
    assert state.paused is None and state.fired == 1


def test_only_the_lock_holder_moves_a_schedule_on(redis, redis_url):
    s = schedule("hourly", every=3600, grace=3600)
    asyncio.run(one_tick(redis_url, [s]))
    redis.set(SCHEDULER_LOCK, "someone-else")

    async def stale_leader():
        client = aconnect(redis_url)
        runner = Scheduler(client, Scripts(client), [s], queue_fire(redis_url), "me")
        runner.is_leader = True  # believes it still leads
        redis.hset(schedule_state("hourly"), "next", server_now(redis) // HOUR * HOUR)
        await runner.tick()
        await client.aclose()
        return runner

    runner = asyncio.run(stale_leader())
    assert not runner.is_leader
    state = sched.read_states(redis, ["hourly"])[0]
    assert state.fired == 0 and state.next_due == server_now(redis) // HOUR * HOUR  # not moved on
    assert len(stream_job_ids(redis)) == 1  # it had added its job before it learnt it no longer leads
    redis.delete(SCHEDULER_LOCK)
    asyncio.run(one_tick(redis_url, [s]))  # the next leader fires the same due time: the same job id, no new job
    assert len(stream_job_ids(redis)) == 1
    assert sched.read_states(redis, ["hourly"])[0].fired == 1


def test_per_fire_attempts_and_backoff_hold_for_every_retry_of_a_fire(redis, redis_url):
    """The worker's default allows five runs; the schedule's fires get two, with its own backoff."""
    s = schedule("flaky", every=1, attempts=2, backoff={"strategy": "fixed", "initial_ms": 20})
    runs = []
    registry = HandlerRegistry()

    async def tick():
        runs.append(time.monotonic())
        raise RuntimeError("the report server is down")

    registry.register("tasks.tick", tick)
    worker = Worker([Q], registry, url=redis_url, install_signal_handlers=False, promoter_poll_interval=0.01,
                    policy=RetryPolicy(max_attempts=5, backoff=1), schedules=[s])

    run_until(worker, lambda: redis.xlen(KEYS.dlq) >= 1)
    entry_id, fields = redis.xrange(KEYS.dlq, count=1)[0]
    dead = decode_entry(Q, entry_id, fields)
    assert dead.job_id.startswith("schedule:flaky:")
    assert len(dead.errors) == 2, "two runs: the schedule's attempts, not the worker's five"
    assert dead.job.max_attempts == 2 and dead.job.backoff["initial_ms"] == 20


def test_a_signing_worker_signs_the_jobs_its_schedules_fire(redis, redis_url):
    """With signing keys, the scheduler's jobs carry the first key's signature and run; nothing is refused."""
    s = schedule("signed", every=1)
    ran = []
    registry = HandlerRegistry()

    async def tick():
        ran.append(1)

    registry.register("tasks.tick", tick)
    worker = Worker([Q], registry, url=redis_url, install_signal_handlers=False, schedules=[s],
                    signing_keys=["current-key-of-at-least-32-bytes!!", "older-key-of-at-least-32-bytes!!!"])

    run_until(worker, lambda: bool(ran))
    assert ran, "the fired job ran"
    assert redis.xlen(KEYS.dlq) == 0
