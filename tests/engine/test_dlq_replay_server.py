"""A replay rewrites each envelope on the server (``dlq_replay.lua``) into exactly the bytes Python writes.

Dead jobs come from a real worker, with arguments of every JSON type (floats
that are whole numbers, nulls, empty maps, text in several scripts), shared
tracebacks and a priority; each replayed envelope is compared byte for byte
with what ``DeadLetters._replayed`` makes of the same entry. Entries the
script leaves (a panic, an entry written before the index, a broken payload)
go the Python way, and nothing is moved twice or lost.
"""

import pytest

from chasqui_core.engine.dlq.entries import decode_entry
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.replay import DeadLetters, _replayed
from chasqui_core.engine.dlq.shared import resolve
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.producer.queue import JobSpec, Queue
from tests.engine.dlq_entries import KEYS, Q, add_dead, dead_job, fields_for
from tests.engine.test_dlq import FAST_RETRIES, run_worker

ARGS = [
    [1.0, None, "x"],
    [{"nested": [1, 2.5, {"deep": None}]}, [], {}],
    ["ñandú 🐦 中文", -7, 2**40, True, False],
    ["a" * 300],
]


def fail_varied(redis, redis_url, *, priority=False) -> int:
    """Jobs that fail twice (their tracebacks shared, the message cut out) with ARGS as arguments."""

    def handler(*args, **kwargs):
        raise RuntimeError(f"could not handle {len(args)} arguments and {sorted(kwargs)}")

    registry = HandlerRegistry()
    registry.register("shop.varied", handler)
    specs = [JobSpec("shop.varied", args, {} if i % 2 else {"k": args[0], "e": {}}) for i, args in enumerate(ARGS)]
    if priority:
        specs.append(JobSpec("shop.varied", [1], {}, priority=5))
    Queue(Q, redis_client=redis).add_bulk(specs)
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == len(specs), policy=FAST_RETRIES)
    return len(specs)


def expected(redis, reset: bool) -> dict[str, bytes]:
    """What Python's path would send back for each entry now in the DLQ, by job id."""
    dead = [decode_entry(Q, eid, fields) for eid, fields in redis.xrange(KEYS.dlq)]
    resolve(redis, KEYS.dlq, dead)
    return {d.job_id: _replayed(d, reset) for d in dead}


def sent_back(redis) -> dict[str, bytes]:
    out = {}
    for key in redis.scan_iter(match=KEYS.stream + "*"):
        if redis.type(key) == b"stream":
            for _, fields in redis.xrange(key):
                out[decode(fields[b"j"]).id] = fields[b"j"]
    return out


@pytest.mark.parametrize("reset", [True, False])
def test_the_server_writes_the_bytes_python_writes(redis, redis_url, reset):
    n = fail_varied(redis, redis_url, priority=True)
    want = expected(redis, reset)
    before = sent_back(redis)
    assert DeadLetters(redis, Q).replay_matching(DLQFilter(task="shop.varied"), reset_attempts=reset) == n
    got = {job_id: payload for job_id, payload in sent_back(redis).items() if job_id not in before}
    assert got == want
    job = decode(next(iter(got.values())))
    assert job.errors[-1]["traceback"].rstrip().endswith(job.errors[-1]["message"])  # the message put back
    assert redis.xlen(KEYS.dlq) == 0
    assert redis.xlen(KEYS.stream + ":high") == 1  # the prioritised job went back to its band


def test_replay_by_id_at_a_time_goes_to_the_delayed_set_with_pythons_bytes(redis, redis_url):
    fail_varied(redis, redis_url)
    want = expected(redis, True)
    ids = [eid.decode() for eid, _ in redis.xrange(KEYS.dlq)]
    dl = DeadLetters(redis, Q)
    reply = dl._scripts.dlq_replay(keys=[KEYS.dlq, KEYS.stream, KEYS.delayed, KEYS.totals],
                                   args=[KEYS.replay_marks, 60_000, "1", 4_000_000_000_000, *ids])
    assert reply == [len(ids)]  # every one rewritten on the server, none left for Python
    members = redis.zrange(KEYS.delayed, 0, -1)
    assert {decode(m).id: m for m in members} == want


def test_entries_the_script_leaves_go_the_python_way(redis, redis_url):
    """A panic, entries written before the index and a broken payload: each once, or left, as before."""
    fail_varied(redis, redis_url)
    served = {eid.decode() for eid, _ in redis.xrange(KEYS.dlq)}
    old = [add_dead(redis, dead_job(messages=("first", "second"))) for _ in range(3)]  # no fp field: pre-index
    panic = add_dead(redis, dead_job(), lua_panic=True)
    broken = redis.xadd(KEYS.dlq, fields_for(dead_job(), payload=b"\x9e\x01not an envelope")).decode()
    want = {d.job_id: _replayed(d, True) for d in
            (decode_entry(Q, eid, f) for eid, f in redis.xrange(KEYS.dlq) if eid.decode() in (*old, panic))}
    dl = DeadLetters(redis, Q)
    assert dl.replay([*served, *old, panic, broken]) == len(served) + 4
    assert [eid.decode() for eid, _ in redis.xrange(KEYS.dlq)] == [broken]  # not a job: it stays
    got = sent_back(redis)
    assert len(got) == len(served) + 4
    for job_id, payload in want.items():
        assert got[job_id] == payload
    assert {decode(payload).replays for payload in got.values()} == {1}
    assert dl.replay([*served, *old, panic]) == 0  # gone: nothing moves twice
