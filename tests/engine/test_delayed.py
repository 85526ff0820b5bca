"""Browsing a queue's delayed set and acting on single delayed jobs."""

import pytest

from chasqui_core.engine.timing import delayed
from chasqui_core.engine.jobs.envelope import Job, decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue

KEYS = QueueKeys.for_queue("sched")
BASE = 1_900_000_000_000  # far in the future, so nothing is promoted meanwhile


def put(client, job_id, score, *, task="tasks.later", **extra):
    member = Job(job_id, task, **extra).encode()
    client.zadd(KEYS.delayed, {member: score})
    return member


def walk(client, limit):
    seen, cursor, pages = [], None, 0
    while True:
        result = delayed.page(client, "sched", cursor=cursor, limit=limit)
        pages += 1
        assert pages <= 1000, "the cursor never reaches the end"
        assert len(result.items) <= limit
        seen += result.items
        if result.next_cursor is None:
            return seen, pages
        cursor = result.next_cursor


@pytest.mark.parametrize("shared", [50, 130])
def test_pages_walk_every_entry_once_in_order(redis, shared):
    # 250 jobs; `shared` of them are due at the same instant, in the middle
    for i in range(250 - shared):
        put(redis, f"solo-{i:03d}", BASE + (i if i < 100 else i + 1000) * 10)
    for i in range(shared):
        put(redis, f"bulk-{i:03d}", BASE + 1500)

    seen, pages = walk(redis, 40)

    ids = [j.job_id for j in seen]
    assert len(ids) == 250 and len(set(ids)) == 250
    assert pages == 7  # 250 / 40, rounded up, with no trailing empty page
    expected = [m for m, _ in redis.zrange(KEYS.delayed, 0, -1, withscores=True)]
    assert [j.member for j in seen] == expected
    assert [j.run_at_ms for j in seen] == sorted(j.run_at_ms for j in seen)
    assert sum(1 for j in seen if j.run_at_ms == BASE + 1500) == shared


def test_page_fields_and_last_page(redis):
    errors = [{"attempt": 1, "class": "KeyError", "message": "x"}]
    put(redis, "retry-me", BASE + 5, task="tasks.flaky", args=[1, "a"], kwargs={"k": True},
        attempt=1, errors=errors)
    put(redis, "first", BASE)
    result = delayed.page(redis, "sched", limit=2)
    assert result.next_cursor is None
    first, second = result.items
    assert (first.job_id, first.run_at_ms, first.attempt) == ("first", BASE, 0)
    assert (second.job_id, second.task, second.run_at_ms) == ("retry-me", "tasks.flaky", BASE + 5)
    assert (second.args, second.kwargs, second.attempt, second.errors) == ([1, "a"], {"k": True}, 1, errors)
    assert decode(second.member).id == "retry-me"


def test_empty_and_missing_queue(redis):
    assert delayed.page(redis, "sched") == delayed.DelayedPage([], None)
    assert delayed.depth(redis, "sched") == 0
    assert delayed.find(redis, "sched", "x") is None


def test_undecodable_members_do_not_break_paging(redis):
    put(redis, "a", BASE)
    redis.zadd(KEYS.delayed, {b"\xc1garbage": BASE + 1, b"\x93\x01\x02\x03": BASE + 2})
    put(redis, "b", BASE + 3)
    seen, _ = walk(redis, 1)
    assert [j.task for j in seen] == ["tasks.later", "<undecodable>", "<undecodable>", "tasks.later"]
    assert seen[1].member == b"\xc1garbage" and seen[1].run_at_ms == BASE + 1
    assert [j.job_id for j in seen] == ["a", "", "", "b"]


@pytest.mark.parametrize("cursor", ["", "abc", "12", "12:x", "nan:1", "5:-1"])
def test_bad_cursor(redis, cursor):
    with pytest.raises(ValueError, match="Cursor"):
        delayed.page(redis, "sched", cursor=cursor)


@pytest.mark.parametrize("limit", [0, -1, 1001, True, "10"])
def test_bad_limit(redis, limit):
    with pytest.raises(ValueError, match="limit"):
        delayed.page(redis, "sched", limit=limit)


def test_depth_counts_real_delayed_adds(redis):
    q = Queue("sched", redis_client=redis)
    for i in range(4):
        q.add("tasks.later", [i], delay=600_000)
    q.add("tasks.now")
    assert delayed.depth(redis, "sched") == 4


def test_find_matches_the_exact_id(redis):
    for i in range(1500):  # more than one ZSCAN batch
        put(redis, f"job-{i}", BASE + i)
    put(redis, "odd*id[1]?\\", BASE)
    found = delayed.find(redis, "sched", "job-1")  # also a prefix of job-10, job-100...
    assert found is not None and found.job_id == "job-1" and found.run_at_ms == BASE + 1
    assert delayed.find(redis, "sched", "job-1499").run_at_ms == BASE + 1499
    assert delayed.find(redis, "sched", "odd*id[1]?\\").job_id == "odd*id[1]?\\"
    assert delayed.find(redis, "sched", "odd") is None
    assert delayed.find(redis, "sched", "job-") is None
    with pytest.raises(ValueError, match="job_id"):
        delayed.find(redis, "sched", "")


def test_cancel(redis):
    q = Queue("sched", redis_client=redis)
    target = q.add("tasks.later", [1], delay=600_000)
    other = q.add("tasks.later", [2], delay=600_000)
    assert delayed.cancel(redis, "sched", target.job_id) is True
    assert delayed.depth(redis, "sched") == 1
    assert delayed.find(redis, "sched", target.job_id) is None
    assert delayed.find(redis, "sched", other.job_id) is not None
    # already gone
    assert delayed.cancel(redis, "sched", target.job_id) is False
    assert delayed.cancel(redis, "sched", "never-existed") is False
    assert redis.xlen(KEYS.stream) == 0


def test_run_now_puts_the_job_on_the_stream(redis):
    q = Queue("sched", redis_client=redis)
    target = q.add("tasks.later", [7], {"x": 1}, delay=600_000)
    q.add("tasks.later", [8], delay=600_000)
    entry_id = delayed.run_now(redis, "sched", target.job_id)
    assert entry_id is not None
    [(stream_id, fields)] = redis.xrange(KEYS.stream)
    assert stream_id.decode() == entry_id
    job = decode(fields[b"j"])
    assert (job.id, job.args, job.kwargs) == (target.job_id, [7], {"x": 1})
    assert delayed.depth(redis, "sched") == 1
    # already gone: run, or cancelled, or promoted
    assert delayed.run_now(redis, "sched", target.job_id) is None
    assert delayed.cancel(redis, "sched", target.job_id) is False
    assert delayed.run_now(redis, "sched", "never-existed") is None
    assert redis.xlen(KEYS.stream) == 1


def test_cancel_frees_a_caller_given_job_id(redis):
    from chasqui_core.engine.timing import delayed
    from chasqui_core.engine.producer.queue import Queue

    queue = Queue("freeing", redis_client=redis)
    assert not queue.add("t", [1], job_id="order-7", delay=60_000).duplicate
    assert queue.add("t", [1], job_id="order-7", delay=60_000).duplicate
    assert delayed.cancel(redis, "freeing", "order-7")
    again = queue.add("t", [2], job_id="order-7", delay=60_000)
    assert not again.duplicate and again.delayed
