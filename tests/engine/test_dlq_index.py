"""The DLQ's index against a real server: kept by every script that writes or removes an entry, rebuilt for
entries written without it, and what the readers answer from it.

``assert_index_matches`` recomputes what the index must hold from the stream
itself and compares every key, so each test checks the whole index, not the
one figure it is about.
"""

import threading
from collections import Counter, defaultdict

import pytest

from bench.console_scale import build_dead
from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.dlq.entries import decode_entry, field_text
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.fingerprint import fingerprint, fingerprint_id
from chasqui_core.engine.dlq.index import DLQIndex, IndexKeys
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.errors import UnrecoverableError
from chasqui_core.engine.ops.lookup import find_job
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.store.keys import DLQ_INDEX_VERSION
from tests.engine.dlq_entries import KEYS, Q, add_dead, bulk_dead, dead_job
from tests.engine.test_dlq import FAST_RETRIES, run_worker

IX = IndexKeys.for_queue(KEYS)


def expected_index(redis):
    """What the index must hold, read from the stream (an entry without ``fp`` gets the fingerprint computed)."""
    want = {"counts": Counter(), "members": defaultdict(set), "groups": Counter(), "group_tasks": defaultdict(Counter),
            "jobs": {}, "classes": {}}
    for eid, flds in redis.xrange(KEYS.dlq):
        dead = decode_entry(Q, eid, flds)
        fp = field_text(flds, b"fp") or fingerprint_id(fingerprint(dead.error_class, dead.error))
        task = field_text(flds, b"task") if b"fp" in flds else dead.task
        reason, cls = field_text(flds, b"reason"), field_text(flds, b"error_class")
        want["counts"].update({"all": 1, f"t:{task}": 1, f"r:{reason}": 1, f"c:{cls}": 1})
        for key in (IX.task(task), IX.reason(reason), IX.group(fp)):
            want["members"][key].add(eid)
        want["classes"][fp] = cls
        want["groups"][fp] += 1
        want["group_tasks"][fp][task] += 1
        want["jobs"][dead.job_id] = eid  # oldest first: the newest entry of a job wins
    return want


def assert_index_matches(redis):
    want = expected_index(redis)
    counts = {k.decode(): int(v) for k, v in redis.hgetall(IX.counts).items()}
    assert counts == dict(want["counts"])
    for key, members in want["members"].items():
        assert set(redis.zrange(key, 0, -1)) == members, key
    for key in redis.scan_iter(match=IX.prefix + "[trcf]:*"):
        assert key.decode() in want["members"], f"{key!r} is left over"
    groups = {fp.decode(): int(n) for fp, n in redis.zrange(IX.groups, 0, -1, withscores=True)}
    assert groups == dict(want["groups"])
    for fp, tasks in want["group_tasks"].items():
        assert {t.decode(): int(n) for t, n in redis.hgetall(IX.group_tasks(fp)).items()} == dict(tasks)
    assert set(redis.hkeys(IX.texts)) == {fp.encode() for fp in want["groups"]}
    assert {fp.decode(): c.decode() for fp, c in redis.hgetall(IX.group_classes).items()} == want["classes"]
    for key in redis.scan_iter(match=KEYS.dlq + ":tb:*"):  # shared tracebacks live exactly as long as their group
        assert key.decode().rpartition(":")[2] in want["groups"], f"{key!r} outlived its group"
    assert {j.decode(): e for j, e in redis.hgetall(IX.jobs).items()} == want["jobs"]
    assert DLQIndex(redis, Q).state().ready


def settle_index(dl):
    """Read until the reads have mended the index (each moves a rebuild on for a moment; a loaded machine may
    need a few)."""
    for _ in range(100):
        if dl.index_state().ready:
            return
    raise AssertionError("the index was not mended by 100 reads")


@pytest.fixture
def dl(redis):
    return DeadLetters(redis, Q)


def fail_in_kinds(registry):
    def handler(kind, n):
        if kind == "lookup":
            raise LookupError(f"user {n} not found")
        if kind == "fatal":
            raise UnrecoverableError(f"account {n} is closed")
        raise TimeoutError(f"upstream answered nothing in {n} ms")

    registry.register("users.sync", handler)
    registry.register("billing.charge", handler)


def test_dead_jobs_of_a_real_worker_are_indexed_as_they_are_written(redis, redis_url, dl):
    registry = HandlerRegistry()
    fail_in_kinds(registry)
    q = Queue(Q, redis_client=redis)
    kinds = ("lookup", "fatal", "timeout")
    jobs = [q.add("users.sync" if i % 2 else "billing.charge", [kinds[i % 3], i]) for i in range(30)]
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 30, policy=FAST_RETRIES)

    assert redis.hget(IX.version, "version") == DLQ_INDEX_VERSION.encode(), \
        "the first dead job records the index's version"
    assert all(b"fp" in flds for _, flds in redis.xrange(KEYS.dlq)), "the worker writes each entry's group"
    assert_index_matches(redis)

    grouping = dl.grouping()
    assert grouping.whole
    assert sorted(g.count for g in grouping.groups) == [10, 10, 10]
    assert sum(g.count for g in grouping.groups) + grouping.other_entries == dl.count() == 30
    lookup = next(g for g in grouping.groups if g.error_class.endswith("LookupError"))
    assert lookup.fingerprint == "LookupError: user <n> not found"
    assert lookup.tasks == ["billing.charge", "users.sync"]
    page = dl.page(filter=DLQFilter(fingerprint=lookup.id), limit=50)
    assert len(page.items) == 10 and page.next_cursor is None
    assert all(d.fingerprint_id == lookup.id for d in page.items)
    assert dl.count_matching(DLQFilter(reason="unrecoverable")) == 10
    assert dl.count_matching(DLQFilter(reason="unrecoverable", task="users.sync")) == 5
    assert dl.count_matching(DLQFilter(error_class="TimeoutError")) == 10  # the short name, as typed

    dead = dl.find_by_job_id(jobs[7].job_id)
    assert dead is not None and dead.job_id == jobs[7].job_id
    found = find_job(redis, jobs[7].job_id, [Q])
    assert found.state == "dead" and found.dead.entry_id == dead.entry_id
    assert "the dead-letter index" in " ".join(found.searched)


def test_every_way_out_of_the_dlq_undoes_the_index(redis, dl):
    build_dead(redis, Q, 300, chunk=100, rare_every=50)
    assert_index_matches(redis)
    ids = [eid.decode() for eid, _ in redis.xrange(KEYS.dlq)]

    assert dl.replay(ids[:20]) == 20
    assert_index_matches(redis)
    assert dl.replay(ids[20:30], run_at_ms=4_000_000_000_000) == 10
    assert_index_matches(redis)
    assert dl.discard(ids[30:45]) == 15
    assert dl.discard(ids[30:45]) == 0, "gone already: nothing is undone twice"
    assert_index_matches(redis)
    rare = DLQFilter(task="shop.tasks.rare_refund")
    assert dl.count_matching(rare) == 5
    assert dl.replay_matching(rare) == 5
    assert_index_matches(redis)
    assert dl.discard_matching(DLQFilter(error_class="ValueError")) > 0
    assert_index_matches(redis)
    left = dl.count()
    assert left > 0
    assert dl.discard_matching(DLQFilter()) == left
    assert dl.count() == 0
    assert_index_matches(redis)
    assert redis.hgetall(IX.counts) == {} and redis.zcard(IX.groups) == 0 and redis.hlen(IX.jobs) == 0


def test_concurrent_replays_of_the_same_entries_count_each_once(redis, redis_url, dl):
    build_dead(redis, Q, 3000)
    entry_ids = [eid.decode() for eid, _ in redis.xrange(KEYS.dlq)]
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
    assert sum(moved) == 3000
    assert redis.xlen(KEYS.stream) == 3000
    assert_index_matches(redis)
    assert redis.hgetall(IX.counts) == {}


def test_a_dlq_written_before_the_index_is_rebuilt_and_then_kept(redis, dl):
    entry_ids, job_ids = bulk_dead(redis, 2500)  # plain XADDs: no fp field, no index
    panic = dead_job("reports.build")
    add_dead(redis, panic, lua_panic=True)  # no task or job id fields: they are read from the envelope
    index = DLQIndex(redis, Q)
    assert not index.state().ready
    seen = []
    state = index.rebuild(progress=lambda done, total: seen.append((done, total)))
    assert state.ready and state.indexed == 2501
    assert seen[-1] == (2501, 2501)
    assert_index_matches(redis)
    assert dl.find_by_job_id(panic.id).job_id == panic.id
    assert dl.count_matching(DLQFilter(task="reports.build")) == 1

    # an entry written by an older worker, beside the index: the next read finds the index short and mends it
    add_dead(redis, dead_job("late.task"))
    assert not index.state().ready
    assert dl.count_matching(DLQFilter(task="late.task")) == 1  # from the index, or a scan while it mends
    settle_index(dl)
    assert_index_matches(redis)

    # legacy entries leave the index through the record the rebuild kept of them
    assert dl.replay(entry_ids[:100]) == 100
    assert dl.discard(entry_ids[100:200]) == 100
    assert_index_matches(redis)
    assert redis.hlen(IX.prefix + "legacy") == 2500 - 200 + 2

    # an entry removed by an older console (a plain XDEL): the index counts too many, and is built again
    redis.xdel(KEYS.dlq, entry_ids[300])
    assert not index.state().ready
    assert dl.count_matching(DLQFilter(task="emails.send")) == 2500 - 200 - 1
    settle_index(dl)
    assert_index_matches(redis)


def test_a_first_dead_job_beside_older_entries_does_not_make_the_index_look_whole(redis, redis_url, dl):
    bulk_dead(redis, 50)
    registry = HandlerRegistry()
    fail_in_kinds(registry)
    Queue(Q, redis_client=redis).add("users.sync", ["fatal", 1])
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 51, policy=FAST_RETRIES)
    assert not DLQIndex(redis, Q).state().ready
    assert dl.count_matching(DLQFilter(task="emails.send")) == 50
    settle_index(dl)
    assert_index_matches(redis)


def test_a_rare_filter_fills_its_first_page_however_few_match(redis, dl):
    build_dead(redis, Q, 30_000, rare_every=10_000)  # 3 of the rare task among 30,000
    rare = DLQFilter(task="shop.tasks.rare_refund")
    page = dl.page(filter=rare, limit=50)
    assert [d.task for d in page.items] == ["shop.tasks.rare_refund"] * 3
    assert page.next_cursor is None and page.scanned == 3

    # a common task and a rare reason: walked from the rare side, checked against the task's set
    both = DLQFilter(task="shop.tasks.task_1", reason="unrecoverable")
    truth = [eid.decode() for eid, f in redis.xrevrange(KEYS.dlq)
             if f[b"task"] == b"shop.tasks.task_1" and f[b"reason"] == b"unrecoverable"]
    assert 0 < len(truth) < 50
    page = dl.page(filter=both, limit=50)
    assert [d.entry_id for d in page.items] == truth and page.next_cursor is None
    assert page.scanned <= dl.count_matching(DLQFilter(reason="unrecoverable"))
    assert dl.count_matching(both) == len(truth)

    # pages of a big match follow the stream's order, with no gaps or repeats across cursors
    common = DLQFilter(error_class="builtins.ValueError")
    expected = [eid.decode() for eid, f in redis.xrevrange(KEYS.dlq) if f[b"error_class"] == b"builtins.ValueError"]
    seen, cursor = [], None
    for _ in range(3):
        page = dl.page(filter=common, limit=500, cursor=cursor)
        assert len(page.items) == 500
        seen += [d.entry_id for d in page.items]
        cursor = page.next_cursor
    assert seen == expected[:1500]
    assert dl.count_matching(common) == len(expected)
    assert dl.count_matching(DLQFilter(error_class="ValueError")) == len(expected)

    # a time range narrows the index's counts and pages alike
    middle = int(expected[len(expected) // 2].split("-")[0])
    ranged = DLQFilter(error_class="ValueError", since_ms=middle)
    newer = [e for e in expected if int(e.split("-")[0]) >= middle]
    assert dl.count_matching(ranged) == len(newer)
    assert [d.entry_id for d in dl.page(filter=ranged, limit=10).items] == newer[:10]
    everything_newer = [eid for eid, _ in redis.xrange(KEYS.dlq, f"{middle}-0", "+")]
    assert dl.count_matching(DLQFilter(since_ms=middle)) == len(everything_newer)
    assert dl.count_matching(DLQFilter(until_ms=middle)) == 30_000 - len(everything_newer)


def test_a_text_filter_with_an_indexed_value_checks_only_that_values_entries(redis, dl):
    build_dead(redis, Q, 2000, rare_every=1000)
    f = DLQFilter(task="shop.tasks.task_2", error_text="no line items")
    truth = [eid.decode() for eid, flds in redis.xrevrange(KEYS.dlq)
             if flds[b"task"] == b"shop.tasks.task_2" and b"no line items" in flds[b"error"]]
    page = dl.page(filter=f, limit=1000)
    assert [d.entry_id for d in page.items] == truth
    assert page.scanned <= dl.count_matching(DLQFilter(task="shop.tasks.task_2"))
    assert dl.count_matching(f) == len(truth)


def test_completions_and_retries_leave_the_index_alone(redis, redis_url):
    registry = HandlerRegistry()
    runs = []

    def flaky(n):
        runs.append(n)
        if runs.count(n) == 1:
            raise TimeoutError(f"first run of {n} timed out")

    registry.register("reports.build", flaky)
    q = Queue(Q, redis_client=redis)
    for n in range(20):
        q.add("reports.build", [n])
    run_worker(redis_url, registry, lambda: len(runs) == 40 and redis.xlen(KEYS.stream) == 0, policy=FAST_RETRIES)
    assert redis.xlen(KEYS.dlq) == 0
    assert list(redis.scan_iter(match=IX.prefix + "*")) == [], "only dead jobs write the index"
