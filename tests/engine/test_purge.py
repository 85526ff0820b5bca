"""Emptying a queue of its waiting jobs (engine/ops/purge.py, purge.lua)."""

from chasqui_core.engine.ops import purge, totals
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue


def _setup(redis, name: str, n: int, delivered: int) -> tuple[Queue, QueueKeys, list[bytes]]:
    q = Queue(name, redis_client=redis)
    q.add_bulk([JobSpec("noop", kwargs={"i": i}) for i in range(n)])
    keys = QueueKeys.for_queue(name)
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    held = []
    if delivered:
        reply = redis.xreadgroup(GROUP, "w-1", {keys.stream: ">"}, count=delivered)
        held = [eid for eid, _ in reply[0][1]]
    return q, keys, held


def test_purge_deletes_waiting_jobs_only_and_counts_them(redis):
    q, keys, held = _setup(redis, "p-waiting", 2_500, 7)
    assert purge.waiting(redis, keys) == 2_493
    chunks = []
    deleted = purge.purge_waiting(redis, keys, upto=purge.newest_ids(redis, keys), chunk=1000, progress=chunks.append)
    assert deleted == 2_493
    assert chunks == [1000, 2000, 2493]
    assert [eid for eid, _ in redis.xrange(keys.stream)] == held, "entries a worker holds stay"
    assert redis.xpending(keys.stream, GROUP)["pending"] == 7
    assert totals.read_totals(redis, ["p-waiting"])["p-waiting"].counters["purged"] == 2_493
    assert purge.waiting(redis, keys) == 0
    assert purge.purge_waiting(redis, keys) == 0, "a second purge finds nothing"
    # the worker's entries are still settled the usual way, and new jobs are read as always
    q.add("noop")
    fresh = redis.xreadgroup(GROUP, "w-1", {keys.stream: ">"}, count=10)
    assert len(fresh[0][1]) == 1


def test_purge_keeps_jobs_added_after_it_began(redis):
    q, keys, _ = _setup(redis, "p-bound", 30, 0)
    upto = purge.newest_ids(redis, keys)
    late = q.add("noop")
    assert purge.purge_waiting(redis, keys, upto=upto, chunk=7) == 30
    left = redis.xrange(keys.stream)
    assert len(left) == 1 and left[0][0].decode() == late.entry_id


def test_purge_of_an_unknown_or_empty_queue_is_nothing(redis):
    keys = QueueKeys.for_queue("p-none")
    assert purge.waiting(redis, keys) == 0
    assert purge.newest_ids(redis, keys) == {"high": "0-0", "": "0-0", "low": "0-0"}
    assert purge.purge_waiting(redis, keys) == 0
