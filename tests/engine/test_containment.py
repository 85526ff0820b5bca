"""Bad task code, bad entries and dead workers stay contained: no stalled worker, no job run twice, none lost.

Each test runs a real worker in this process against the test server.
"""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest

from chasqui_core.engine.jobs import events
from chasqui_core.engine.jobs.backoff import BackoffSpec, register_strategy
from chasqui_core.engine.jobs.envelope import Job, decode, new_job_id, now_ms
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.worker.worker import Worker
from tests.helpers import keys_matching, run_until

Q = "contain"
KEYS = QueueKeys.for_queue(Q)


class BrokenMessage(Exception):
    """An exception whose message formats an attribute of None: str() raises."""

    def __init__(self, order):
        super().__init__()
        self.order = order

    def __str__(self):
        return f"order {self.order.number} failed"  # AttributeError: None has no 'number'


def _zero_wait(spec, n, error):
    return None  # a buggy strategy: should be a number of milliseconds


register_strategy("returns-none", _zero_wait)


def run_worker(redis_url, registry, until, *, timeout=30.0, **options):
    worker = Worker([Q], registry, url=redis_url, install_signal_handlers=False, promoter_poll_interval=0.01,
                    **options)

    run_until(worker, until, timeout)
    return worker


def dlq_entries(redis):
    return [fields for _, fields in redis.xrange(KEYS.dlq)]


def test_async_exceptions_that_cannot_print_themselves_do_not_stall_the_worker(redis, redis_url):
    done = []
    registry = HandlerRegistry()

    async def broken(i):
        raise BrokenMessage(None)

    async def fine(i):
        done.append(i)

    registry.register("broken", broken, max_attempts=2, backoff=1)
    registry.register("fine", fine)
    queue = Queue(Q, redis_client=redis)
    queue.add_bulk([JobSpec("broken", [i]) for i in range(6)])  # more than the worker's slots
    queue.add_bulk([JobSpec("fine", [i]) for i in range(20)])
    run_worker(redis_url, registry, lambda: len(done) == 20 and redis.xlen(KEYS.dlq) == 6, concurrency=3)
    assert sorted(done) == list(range(20))
    dead = dlq_entries(redis)
    assert len(dead) == 6 and {d[b"reason"] for d in dead} == {b"retries_exhausted"}
    job = decode(dead[0][b"j"])
    assert len(job.errors) == 2  # both runs recorded, and retried in between
    assert "str() raised AttributeError" in job.errors[0]["message"]


def test_a_backoff_strategy_returning_none_dead_letters_only_its_job_as_internal(redis, redis_url):
    done = []
    registry = HandlerRegistry()

    async def fails(i):
        raise RuntimeError(f"boom {i}")

    async def fine(i):
        done.append(i)

    registry.register("fails", fails, max_attempts=5, backoff=BackoffSpec(strategy="returns-none"))
    registry.register("fine", fine)
    queue = Queue(Q, redis_client=redis)
    queue.add_bulk([JobSpec("fails", [i]) for i in range(4)] + [JobSpec("fine", [i]) for i in range(10)])
    run_worker(redis_url, registry, lambda: len(done) == 10 and redis.xlen(KEYS.dlq) == 4, concurrency=2)
    assert sorted(done) == list(range(10))
    dead = dlq_entries(redis)
    assert [d[b"reason"] for d in dead] == [b"internal"] * 4
    assert all(b"recording the outcome failed: TypeError" in d[b"error"] for d in dead)
    assert redis.xpending(KEYS.stream, GROUP)["pending"] == 0


def test_a_sync_failure_that_cannot_print_itself_leaves_its_batch_alone(redis, redis_url):
    done = []
    registry = HandlerRegistry()

    def maybe(i):
        if i % 5 == 0:
            raise BrokenMessage(None)
        done.append(i)

    registry.register("maybe", maybe, max_attempts=1)
    Queue(Q, redis_client=redis).add_bulk([JobSpec("maybe", [i]) for i in range(50)])
    run_worker(redis_url, registry, lambda: len(done) == 40 and redis.xlen(KEYS.dlq) == 10, concurrency=4)
    assert sorted(done) == [i for i in range(50) if i % 5]
    assert redis.xlen(KEYS.dlq) == 10
    assert {d[b"reason"] for d in dlq_entries(redis)} == {b"retries_exhausted"}
    assert redis.xpending(KEYS.stream, GROUP)["pending"] == 0 and redis.xlen(KEYS.stream) == 0


def test_system_exit_in_a_handler_fails_its_job_not_the_worker(redis, redis_url):
    done = []
    registry = HandlerRegistry()

    def quits(i):
        raise SystemExit(3)

    async def aquits(i):
        raise SystemExit(4)

    def fine(i):
        done.append(i)

    registry.register("quits", quits, max_attempts=1)
    registry.register("aquits", aquits, max_attempts=1)
    registry.register("fine", fine)
    queue = Queue(Q, redis_client=redis)
    queue.add_bulk([JobSpec("quits", [i]) for i in range(3)] + [JobSpec("aquits", [i]) for i in range(3)]
                   + [JobSpec("fine", [i]) for i in range(10)])
    run_worker(redis_url, registry, lambda: len(done) == 10 and redis.xlen(KEYS.dlq) == 6, concurrency=2)
    assert sorted(done) == list(range(10)) and redis.xlen(KEYS.dlq) == 6


def _raw_envelope(task, args, **changes):
    job = Job(new_job_id(), task, args, {}, 0, now_ms(), None, None, [], 0, 60, 0, {})
    fields = job.encode()
    raw = msgpack.unpackb(fields)
    names = ["version", "id", "task", "args", "kwargs", "attempt", "created_at", "max_attempts", "backoff", "errors",
             "replays", "result_ttl", "deaths", "meta"]
    for name, value in changes.items():
        raw[names.index(name)] = value
    return msgpack.packb(raw, use_bin_type=True)


@pytest.mark.parametrize("field, value, words", [
    ("result_ttl", -5, "result_ttl must be between 0"),
    ("attempt", "2", "attempt must be a whole number"),
    ("max_attempts", 0, "max_attempts must be empty or a whole number of 1 or more"),
    ("backoff", [1, 2], "backoff must be empty or a map"),
    ("errors", ["not a record"], "error history entry is not a map"),
    ("meta", [1], "meta a map"),
])
def test_an_entry_with_a_bad_field_is_dead_lettered_alone(redis, redis_url, field, value, words):
    runs = []
    registry = HandlerRegistry()

    def work(i):
        runs.append(i)
        return i

    registry.register("work", work)
    queue = Queue(Q, redis_client=redis)
    queue.add_bulk([JobSpec("work", [i], result_ttl=60) for i in range(22)])
    redis.xadd(KEYS.stream, {"j": _raw_envelope("work", [-1], **{field: value})})
    queue.add_bulk([JobSpec("work", [i], result_ttl=60) for i in range(22, 44)])
    run_worker(redis_url, registry, lambda: len(runs) >= 44 and redis.xlen(KEYS.dlq) == 1, batch_size=100)
    time.sleep(0.2)
    assert sorted(runs) == list(range(44))  # every good job ran exactly once
    [dead] = dlq_entries(redis)
    assert dead[b"reason"] == b"decode_failed" and words.encode() in dead[b"error"]
    assert redis.xpending(KEYS.stream, GROUP)["pending"] == 0
    assert len(keys_matching(redis, KEYS.result + "*")) == 44


def test_a_settle_batch_with_a_bad_retry_settles_every_other_item_once(redis):
    """The last line of defence: settle.lua applies each item whole or not at all."""
    redis.xgroup_create(KEYS.stream, GROUP, id="0", mkstream=True)
    ids = [redis.xadd(KEYS.stream, {"j": _raw_envelope("t", [i])}) for i in range(5)]
    redis.xreadgroup(GROUP, "me", {KEYS.stream: ">"}, count=10)

    async def settle():
        from chasqui_core.engine.store.connection import aconnect, url_of

        client = aconnect(url_of(redis))
        settler = Settler(client, Scripts(client))
        settler.complete(KEYS, ids[0], "a", "t", 1, (KEYS.result + "a", 60_000, b"ok"))
        settler.complete(KEYS, ids[1], "b", "t", 1, (KEYS.result + "b", -5, b"bad ttl"))
        settler.retry(KEYS, ids[2], "soon", b"payload-c", job_id="c", task="t", attempt=1, error_class="E",
                      error="e", duration_ms=1)
        settler.retry(KEYS, ids[3], 10, b"payload-d", job_id="d", task="t", attempt=1, error_class="E", error="e",
                      duration_ms=1)
        settler.dead(KEYS, ids[4], b"payload-e", "retries_exhausted", job_id="e", task="t")
        await settler.flush()
        await client.aclose()

    asyncio.run(settle())
    assert redis.xpending(KEYS.stream, GROUP)["pending"] == 0 and redis.xlen(KEYS.stream) == 0
    assert redis.get(KEYS.result + "a") == b"ok" and redis.get(KEYS.result + "b") is None
    assert redis.zrange(KEYS.delayed, 0, -1) == [b"payload-d"]
    dead = {d[b"job_id"]: d for d in dlq_entries(redis)}
    assert set(dead) == {b"c", b"e"}
    assert dead[b"c"][b"reason"] == b"internal" and b"retry delay" in dead[b"c"][b"error"]
    assert dead[b"c"][b"j"] == b"payload-c"
    _, seen = events.read_events(redis, Q)
    [scheduled] = [e for e in seen if e.type == events.RETRY_SCHEDULED]  # only d's retry was scheduled
    assert (scheduled.job_id, scheduled.task, scheduled.backoff_ms, scheduled.error_class) == ("d", "t", 10, "E")
    [internal] = [e for e in seen if e.type == events.DLQ and e.reason == "internal"]
    assert (internal.job_id, internal.task, internal.duration_ms) == ("c", "t", 1)


def test_a_repeated_settle_call_schedules_each_retry_once(redis):
    """A retry whose entry another call settled already is left alone, and left out of the events."""
    redis.xgroup_create(KEYS.stream, GROUP, id="0", mkstream=True)
    ids = [redis.xadd(KEYS.stream, {"j": _raw_envelope("t", [i])}) for i in range(3)]
    redis.xreadgroup(GROUP, "me", {KEYS.stream: ">"}, count=10)

    async def settle(retries):
        from chasqui_core.engine.store.connection import aconnect, url_of

        client = aconnect(url_of(redis))
        settler = Settler(client, Scripts(client))
        for n in retries:
            settler.retry(KEYS, ids[n], 60_000, f"payload-{n}".encode(), job_id=f"job-{n}", task="t", attempt=1,
                          error_class="E", error=f"error {n}", duration_ms=n)
        await settler.flush()
        await client.aclose()

    asyncio.run(settle([1]))
    asyncio.run(settle([0, 1, 2]))  # 1 again, as a call repeated after a lost reply would
    assert redis.xpending(KEYS.stream, GROUP)["pending"] == 0 and redis.xlen(KEYS.stream) == 0
    assert sorted(redis.zrange(KEYS.delayed, 0, -1)) == [b"payload-0", b"payload-1", b"payload-2"]
    _, seen = events.read_events(redis, Q)
    scheduled = [(e.job_id, e.error_message, e.duration_ms) for e in seen if e.type == events.RETRY_SCHEDULED]
    assert scheduled == [("job-1", "error 1", 1), ("job-0", "error 0", 0), ("job-2", "error 2", 2)]
    entries = [fields for _, fields in redis.xrange(KEYS.events) if fields[b"type"] == b"retry_scheduled"]
    assert [e[b"count"] for e in entries] == [b"1", b"2"]
    assert redis.hget(KEYS.totals, "retried") == b"3"


def test_dead_workers_leave_the_group_and_the_list_once_their_jobs_are_reclaimed(redis, redis_url):
    done = []
    registry = HandlerRegistry()

    def work(i):
        done.append(i)

    registry.register("work", work)
    queue = Queue(Q, redis_client=redis)
    redis.xgroup_create(KEYS.stream, GROUP, id="0", mkstream=True)
    queue.add("work", [1])
    redis.xreadgroup(GROUP, "ghost-with-a-job", {KEYS.stream: ">"}, count=1)  # dies holding job 1
    redis.xreadgroup(GROUP, "ghost-idle", {KEYS.stream: ">"}, count=1)  # dies holding nothing
    long_ago = now_ms() - 3_600_000
    for name in ("ghost-with-a-job", "ghost-idle", "ghost-heartbeat-only"):
        redis.hset(KEYS.workers, name, msgpack.packb({"id": name, "last_seen": long_ago}))
    queue.add("work", [2])

    def consumers():
        return {c["name"].decode() for c in redis.xinfo_consumers(KEYS.stream, GROUP)}

    worker = run_worker(redis_url, registry, lambda: len(done) == 2 and consumers() == {"live-worker"},
                        visibility_timeout_ms=300, dead_worker_grace_ms=1000, worker_id="live-worker")
    assert sorted(done) == [1, 2]  # the dead worker's job was reclaimed and run, not dropped
    assert consumers() == {"live-worker"}
    assert redis.hkeys(KEYS.workers) == []  # the live one removed its own heartbeat when it stopped
    assert worker.problem == ""



def test_a_message_with_undecodable_bytes_is_escaped_and_retried_as_usual(redis, redis_url):
    runs = []
    registry = HandlerRegistry()

    async def garbled(i):
        runs.append(i)
        raise ValueError(b"bad byte \xff here".decode("utf-8", "surrogateescape"))

    registry.register("garbled", garbled, max_attempts=2, backoff=1)
    Queue(Q, redis_client=redis).add("garbled", [1])
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 1)
    assert runs == [1, 1]  # retried, not dead-lettered as internal on the first run
    [dead] = dlq_entries(redis)
    assert dead[b"reason"] == b"retries_exhausted"
    assert "bad byte \\udcff here" in decode(dead[b"j"]).errors[0]["message"]


def test_jobs_that_wait_run_side_by_side_up_to_the_concurrency_and_state_does_not_leak(redis, redis_url):
    """Up to ``concurrency`` jobs wait at once; jobs that never wait run in between; none sees another's context."""
    import contextvars

    seen = contextvars.ContextVar("seen", default=None)
    running = {"now": 0, "peak": 0}
    done: list[tuple[str, int, object]] = []
    registry = HandlerRegistry()

    async def waits(i):
        running["now"] += 1
        running["peak"] = max(running["peak"], running["now"])
        try:
            await asyncio.sleep(0.02)
        finally:
            running["now"] -= 1
        done.append(("waits", i, seen.get()))
        seen.set(i)  # left behind on purpose: the next job run by this runner must not see it

    async def quick(i):
        done.append(("quick", i, seen.get()))
        seen.set(i)

    registry.register("waits", waits)
    registry.register("quick", quick)
    specs = [JobSpec("waits" if i % 2 else "quick", [i]) for i in range(40)]
    Queue(Q, redis_client=redis).add_bulk(specs)
    run_worker(redis_url, registry, lambda: len(done) == 40, concurrency=4)
    assert sorted(i for _, i, _ in done) == list(range(40))
    assert running["peak"] == 4  # twenty jobs that wait, four at a time
    assert [leak for _, _, leak in done] == [None] * 40
