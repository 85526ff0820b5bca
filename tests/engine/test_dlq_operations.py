"""DLQ operations run by workers, free-text search and the confirmation's estimate, against a real server."""

import multiprocessing
import os
import signal
import threading
import time

import pytest

from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.dlq.estimate import estimate_matching
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.operations import Operations, run_pending
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.dlq.entries import decode_entry
from chasqui_core.engine.dlq.search import TextSearch, visible_texts
from chasqui_core.engine.jobs.envelope import Job, decode, new_job_id, now_ms
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.dlq_entries import KEYS, Q, add_dead, bulk_dead, dead_job, err
from tests.engine.test_dlq import run_worker


def stream_job_ids(redis) -> list[str]:
    return [decode(f[b"j"]).id for _, f in redis.xrange(KEYS.stream)]


def wait_for(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s")
        time.sleep(0.02)


@pytest.fixture
def ops(redis):
    return Operations(redis, Q)


def test_an_operation_is_claimed_by_one_runner_and_replays_every_match_once(redis, ops):
    _, job_ids = bulk_dead(redis, 5000)
    others, _ = bulk_dead(redis, 300, task="reports.build")
    ops.submit("op1", "replay", DLQFilter(task="emails.send"), total=5000)
    assert ops.claim_next("a") == "op1"
    assert ops.claim_next("b") is None  # a is alive: nobody else takes it
    record = ops.run("op1", "a")
    assert (record.state, record.done, record.count, record.total, record.total_exact) == (
        "done",
        5000,
        5000,
        5000,
        True,
    )
    assert sorted(stream_job_ids(redis)) == sorted(job_ids)
    assert {e.decode() for e, _ in redis.xrange(KEYS.dlq)} == set(others)
    assert ops.pending() == [] and ops.claim_next("b") is None


def _slow_runner(url, stale_ms):
    client = connect(url)
    run_pending(client, Q, "doomed", stale_ms=stale_ms)


def test_a_runner_that_dies_mid_way_is_resumed_without_replaying_any_entry_twice(redis, redis_url, ops):
    _, job_ids = bulk_dead(redis, 3000)
    ops.submit("op2", "replay", DLQFilter(), rate=1000, total=3000)
    child = multiprocessing.get_context("fork").Process(target=_slow_runner, args=(redis_url, 60_000))
    child.start()
    try:
        wait_for(lambda: (ops.get("op2").done or 0) >= 400)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    before = ops.get("op2")
    assert before.state == "running" and before.owner == "doomed" and before.done < 3000
    assert run_pending(redis, Q, "fresh", stale_ms=60_000) == []  # its heartbeat is recent: not taken yet
    time.sleep(0.6)
    [after] = run_pending(redis, Q, "fresh", stale_ms=500)
    assert after.state == "done" and after.claims == 2 and after.owner == "fresh"
    ids = stream_job_ids(redis)
    assert len(ids) == len(set(ids)) == 3000 and set(ids) == set(job_ids)
    assert redis.xlen(KEYS.dlq) == 0
    assert int(redis.hget(KEYS.totals, "replayed")) == 3000
    # the figures may miss what the dead runner moved without writing it down, never more than a burst
    assert 3000 - 200 <= after.count <= 3000


def test_cancel_stops_between_chunks_and_what_is_done_stays_done(redis, ops):
    bulk_dead(redis, 2000)
    ops.submit("op3", "replay", DLQFilter(), rate=500)
    result = {}
    runner = threading.Thread(target=lambda: result.update(r=run_pending(redis, Q, "w")))
    runner.start()
    wait_for(lambda: (ops.get("op3").done or 0) > 0)
    ops.cancel("op3")
    runner.join(20)
    [record] = result["r"]
    assert record.state == "cancelled" and 0 < record.done < 2000
    assert (record.total, record.total_exact) == (2000, True)  # "N of 2,000 handled", not "N of N"
    assert redis.xlen(KEYS.stream) == record.count
    assert redis.xlen(KEYS.stream) + redis.xlen(KEYS.dlq) == 2000


def test_cancel_of_an_operation_nobody_runs_ends_it_at_once(redis, ops):
    bulk_dead(redis, 10)
    ops.submit("op4", "discard", DLQFilter())
    record = ops.cancel("op4")
    assert record.state == "cancelled" and record.done == 0
    assert ops.pending() == [] and run_pending(redis, Q, "w") == []
    assert redis.xlen(KEYS.dlq) == 10
    assert ops.cancel("nope") is None


def test_rate_limit_is_honoured(redis, ops):
    bulk_dead(redis, 600)
    ops.submit("op5", "replay", DLQFilter(), rate=300)
    started = time.monotonic()
    [record] = run_pending(redis, Q, "w")
    elapsed = time.monotonic() - started
    assert record.count == 600
    assert elapsed >= 0.8 * 600 / 300  # 600 jobs at 300/s: two seconds at least, give or take a burst


def test_a_runner_that_stops_gives_the_operation_back_and_another_finishes_it(redis, ops):
    bulk_dead(redis, 5000)
    ops.submit("op6", "discard", DLQFilter(), total=5000)
    asked = []

    def stop():
        asked.append(1)
        return len(asked) > 1  # after the first chunk

    assert ops.claim_next("a") == "op6"
    record = ops.run("op6", "a", should_stop=stop, chunk=1000)
    assert record.state == "pending" and record.done == 1000 and record.owner == ""
    [record] = run_pending(redis, Q, "b")
    assert (record.state, record.done, record.count, record.claims) == ("done", 5000, 5000, 2)
    assert redis.xlen(KEYS.dlq) == 0


def test_rejects_bad_definitions(ops):
    with pytest.raises(ValueError, match="kind"):
        ops.submit("x", "burn", DLQFilter())
    with pytest.raises(ValueError, match="rate"):
        ops.submit("x", "replay", DLQFilter(), rate=0)
    with pytest.raises(TypeError, match="DLQFilter"):
        ops.submit("x", "replay", {"task": "a"})


def test_a_worker_runs_the_operations_of_its_queues(redis, redis_url, ops):
    bulk_dead(redis, 1500)
    ops.submit("op7", "discard", DLQFilter(task="emails.send"))
    run_worker(redis_url, HandlerRegistry(), lambda: ops.get("op7").state == "done")
    record = ops.get("op7")
    assert record.count == 1500 and redis.xlen(KEYS.dlq) == 0


# --- search ---------------------------------------------------------------------------------------


def test_search_finds_rare_matches_across_chunks_newest_first(redis):
    bulk_dead(redis, 1200)
    rare = add_dead(
        redis, Job(new_job_id(), "emails.send", ["needle-in-ARGS"], {}, created_at=now_ms(), errors=[err("boom")])
    )
    bulk_dead(redis, 1200)
    by_error = add_dead(redis, dead_job(messages=("the NEEDLE-in-args broke",)))
    bulk_dead(redis, 700)
    search = TextSearch(redis, Q)
    page = search.search("Needle-in-args", chunk=500, time_limit=30)
    assert [d.entry_id for d in page.items] == [by_error, rare]
    assert page.next_cursor is None and page.scanned == page.total == 3102
    first = search.search("needle-in-args", limit=1, chunk=500, time_limit=30)
    assert [d.entry_id for d in first.items] == [by_error]
    rest = search.search("needle-in-args", limit=1, cursor=first.next_cursor, chunk=500, time_limit=30)
    assert [d.entry_id for d in rest.items] == [rare]
    bounded = search.search("no such text", scan_limit=1000, chunk=500)
    assert bounded.items == [] and bounded.scanned == 1000 and bounded.next_cursor is not None


def _every_match(redis, text: str) -> list[str]:
    """The entry ids a search for ``text`` must return, newest first: every entry read and checked here."""
    folded = text.casefold()
    return [
        eid.decode()
        for eid, fields in redis.xrevrange(KEYS.dlq)
        if any(folded in t.casefold() for t in visible_texts(decode_entry(Q, eid, fields)))
    ]


def _all_pages(search: TextSearch, text: str, **kw) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = search.search(text, cursor=cursor, time_limit=30, **kw)
        ids += [d.entry_id for d in page.items]
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


def test_search_results_do_not_depend_on_chunks_or_pages(redis):
    bulk_dead(redis, 300)
    # fields in another order than settle.lua writes them; the needle only in the last error
    for i in range(5):
        job = dead_job(messages=(f"row {i} failed",))
        redis.xadd(
            KEYS.dlq,
            {
                "reason": "lost",
                "error": f"worker LOST at row 4{i}",
                "j": job.encode(),
                "task": job.task,
                "job_id": job.id,
                "error_class": "WorkerLost",
            },
        )
    bulk_dead(redis, 300)
    search = TextSearch(redis, Q)
    # a digit anchor; a letter anchor found in upper case, in entries laid out another way; every entry a candidate
    for text in ("row 4", "lost AT", "ROW"):
        expected = _every_match(redis, text)
        assert expected, text
        assert [d.entry_id for d in search.search(text, limit=1000, time_limit=30).items] == expected
        for chunk in (1, 7, 50, 64, 250, 1000):
            assert _all_pages(search, text, limit=1000, chunk=chunk) == expected, (text, chunk)
        for limit in (1, 7, 50):
            assert _all_pages(search, text, limit=limit, chunk=101) == expected, (text, limit)


def test_search_pages_skip_candidates_a_mask_hides(redis):
    shown = []
    for i in range(120):
        if i % 12 == 5:
            args, kwargs = ["zq-needle"], {}
        else:  # the needle only as a masked value: a candidate in the raw text, never a match
            args, kwargs = [], {"password": f"zq-needle-{i}"}
        eid = add_dead(redis, Job(new_job_id(), "billing.charge", args, kwargs, created_at=now_ms(), errors=[err("x")]))
        if args:
            shown.append(eid)
    search = TextSearch(redis, Q)
    expected = _every_match(redis, "zq-needle")
    assert expected == shown[::-1]
    for limit in (1, 3, 50):
        assert _all_pages(search, "ZQ-needle", limit=limit, chunk=1000) == expected, limit


def test_search_never_matches_a_masked_secret(redis):
    secret = add_dead(
        redis,
        Job(
            new_job_id(),
            "billing.charge",
            [],
            {"password": "hunter2", "who": "ana"},
            created_at=now_ms(),
            errors=[err("login failed: token=sekr3t for ana")],
        ),
    )
    search = TextSearch(redis, Q)
    assert search.search("hunter2").items == []
    assert search.search("sekr3t").items == []
    [found] = search.search("for ana").items
    assert found.entry_id == secret
    assert [d.entry_id for d in search.search("password").items] == [secret]  # the key is shown, its value is not
    with pytest.raises(ValueError, match="Type some text"):
        search.search("  ")


# --- the confirmation's estimate ----------------------------------------------------------------


def test_estimate_is_exact_when_small_or_indexed_and_close_when_large(redis):
    dl = DeadLetters(redis, Q)
    bulk_dead(redis, 3000)
    bulk_dead(redis, 1000, task="reports.build")
    small = estimate_matching(dl, DLQFilter(task="reports.build", error_text="failed"), budget=10_000)
    assert (small.count, small.exact) == (1000, True)
    dl.index.rebuild()  # entries written by hand, as an older version did: indexed at once rather than over reads
    indexed = estimate_matching(dl, DLQFilter(task="reports.build"), budget=1000, samples=4)
    assert (indexed.count, indexed.exact) == (1000, True)  # counted from the index, whatever the budget
    big = estimate_matching(dl, DLQFilter(task="reports.build"), budget=1000, samples=4, use_index=False)
    assert not big.exact and 0 <= big.count <= 4000
    assert estimate_matching(dl, DLQFilter()).count == 4000
    assert estimate_matching(dl, DLQFilter(task="nothing"), budget=100_000).count == 0


@pytest.mark.parametrize(
    ("matching", "others"),
    [
        ([1_000_000 + i * 10 for i in range(3000)], [1_030_000 + i for i in range(7000)]),  # a quiet spell, a burst
        ([2_000_000 + i // 100 for i in range(4000)], [2_000_100 + i * 180 for i in range(2000)]),  # a burst first
    ],
)
def test_the_estimate_of_a_big_set_weighs_busy_and_quiet_times(redis, matching, others):
    rows = sorted([(ms, "a") for ms in matching] + [(ms, "b") for ms in others])
    pipe = redis.pipeline(transaction=False)
    for seq, (ms, task) in enumerate(rows, 1):
        pipe.xadd(KEYS.dlq, {"task": task, "reason": "retries_exhausted"}, id=f"{ms}-{seq}")
    pipe.execute()
    estimate = estimate_matching(DeadLetters(redis, Q), DLQFilter(task="a"), budget=1000, samples=10, use_index=False)
    assert not estimate.exact
    assert 0.5 * len(matching) <= estimate.count <= 1.5 * len(matching), estimate
