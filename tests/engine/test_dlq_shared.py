"""What dead-letter entries share is stored once per error group, and every reader puts it back.

Dead jobs come from a real worker; the texts are checked as each reader
returns them (an entry, a job found by id, a replayed job, a search match),
and their lifetime against the group's entries.
"""

import pytest

from chasqui_core.engine.dlq import index as index_module
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.index import INDEX_VERSION
from chasqui_core.engine.dlq.search import TextSearch
from chasqui_core.engine.dlq.shared import texts_key
from chasqui_core.engine.jobs.errors import UnrecoverableError
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.ops.lookup import find_job
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.dlq.replay import DeadLetters
from tests.engine.test_dlq import FAST_RETRIES, KEYS, Q, add_dead, dead_job, run_worker, stream_jobs

N = 30


@pytest.fixture
def dl(redis):
    return DeadLetters(redis, Q)


def fail_orders(redis, redis_url) -> dict[str, int]:
    """N jobs that fail twice at the same line, each with its own order number; returns job id -> number."""

    def handler(n):
        raise LookupError(f"order {n} has no line items")

    registry = HandlerRegistry()
    registry.register("shop.orders", handler)
    added = Queue(Q, redis_client=redis).add_bulk([JobSpec("shop.orders", [n]) for n in range(N)])
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == N, policy=FAST_RETRIES)
    return {a.job_id: n for a, n in zip(added, range(N), strict=True)}


def check_history(errors, n):
    """Both runs' records whole: the class and message, and the traceback ending with this job's message."""
    assert len(errors) == 2
    for record in errors:
        assert record["class"].endswith("LookupError")
        assert record["message"] == f"order {n} has no line items"
        tb = record["traceback"]
        assert tb.startswith("Traceback (most recent call last):") and "in handler" in tb
        assert tb.rstrip().endswith(f"LookupError: order {n} has no line items")
        assert "tb" not in record and "entry" not in record


def test_tracebacks_are_stored_once_per_group_and_read_back_whole(redis, redis_url, dl):
    numbers = fail_orders(redis, redis_url)
    rows = redis.xrange(KEYS.dlq)
    assert all(b"Traceback" not in fields[b"j"] for _, fields in rows)  # the envelopes name their texts
    [group] = {fields[b"fp"].decode() for _, fields in rows}
    shared = redis.hgetall(texts_key(KEYS.dlq, group))
    assert len(shared) == 1  # thirty jobs, two runs each: one text
    [text] = shared.values()
    assert text.endswith(b"LookupError: \x00\n")  # the message is each job's own, put back when read

    for eid, _ in rows:
        dead = dl.get(eid.decode())
        check_history(dead.errors, numbers[dead.job_id])
        assert dead.job is not None and dead.job.errors == dead.errors
    some = next(iter(numbers))
    check_history(dl.find_by_job_id(some).errors, numbers[some])
    found = find_job(redis, some, [Q])
    assert found.state == "dead"
    check_history(found.dead.errors, numbers[some])

    [match] = TextSearch(redis, Q).search("order 7 has").items
    check_history(match.errors, 7)
    # text only the shared traceback holds (the handler's source line): found through the entries naming it
    assert not any(b"raise LookupError" in fields[b"j"] for _, fields in rows)
    found = TextSearch(redis, Q).search('RAISE lookuperror(f"order', limit=100, time_limit=30).items
    assert sorted(d.job_id for d in found) == sorted(numbers)
    assert TextSearch(redis, Q).search("raise nothing like this", time_limit=30).items == []


class PaymentDeclined(UnrecoverableError):
    pass


def test_a_search_finds_the_last_errors_class_which_the_envelope_leaves_to_the_entry(redis, redis_url):
    def handler(n):
        raise PaymentDeclined(f"card {n} refused")

    registry = HandlerRegistry()
    registry.register("shop.charge", handler)
    Queue(Q, redis_client=redis).add_bulk([JobSpec("shop.charge", [n]) for n in range(5)])
    run_worker(redis_url, registry, lambda: redis.xlen(KEYS.dlq) == 5, policy=FAST_RETRIES)
    assert all(b"PaymentDeclined" not in fields[b"j"] for _, fields in redis.xrange(KEYS.dlq))
    found = TextSearch(redis, Q).search("paymentdeclined", time_limit=30).items
    assert len(found) == 5
    assert all(d.errors[-1]["class"].endswith("PaymentDeclined") for d in found)


def test_a_replayed_job_goes_back_with_its_whole_history(redis, redis_url, dl):
    numbers = fail_orders(redis, redis_url)
    assert dl.replay_matching(DLQFilter(task="shop.orders")) == N
    back = stream_jobs(redis)
    assert {job.id for job in back} == set(numbers)
    for job in back:
        check_history(job.errors, numbers[job.id])


def test_the_texts_go_with_the_groups_last_entry(redis, redis_url, dl):
    fail_orders(redis, redis_url)
    rows = redis.xrange(KEYS.dlq)
    key = texts_key(KEYS.dlq, rows[0][1][b"fp"].decode())
    assert dl.discard([eid.decode() for eid, _ in rows[:-1]]) == N - 1
    assert redis.exists(key)  # one entry still names it
    assert dl.replay([rows[-1][0].decode()]) == 1
    assert not redis.exists(key)
    assert not redis.keys(KEYS.dlq + ":tb:*")


def test_entries_written_before_keep_their_texts_inline(redis, dl):
    job = dead_job(messages=("first", "second"))
    eid = add_dead(redis, job)
    dead = dl.get(eid)
    assert dead.errors == job.errors
    assert dead.errors[-1]["traceback"].endswith("ValueError: second\n")


def test_a_groups_texts_removed_mid_rebuild_are_swept_when_the_rebuild_ends(redis, redis_url, dl):
    """Entries taken out while a rebuild has not indexed them leave no count to bring to zero: the pass's end
    deletes the texts no entry names any more."""
    fail_orders(redis, redis_url)
    key = texts_key(KEYS.dlq, redis.xrange(KEYS.dlq)[0][1][b"fp"].decode())
    dl.index.scripts.dlq_reindex(keys=[KEYS.dlq], args=["reset", INDEX_VERSION])  # as after an upgrade
    assert dl.discard([eid.decode() for eid, _ in redis.xrange(KEYS.dlq)]) == N
    assert redis.exists(key)  # the rebuild had not reached them: nothing could tell they were the group's last
    assert dl.index.rebuild().ready
    assert not redis.keys(KEYS.dlq + ":tb:*")
    assert not redis.smembers(KEYS.dlq + ":tbgroups")


def test_a_groups_texts_outlive_its_indexed_entries_while_others_wait_for_the_rebuild(redis, redis_url, dl,
                                                                                     monkeypatch):
    """Mid-rebuild a group's count covers only the entries indexed so far: removing those must not delete
    the texts the entries not indexed yet still name."""
    numbers = fail_orders(redis, redis_url)
    rows = redis.xrange(KEYS.dlq)
    key = texts_key(KEYS.dlq, rows[0][1][b"fp"].decode())
    dl.index.scripts.dlq_reindex(keys=[KEYS.dlq], args=["reset", INDEX_VERSION])
    monkeypatch.setattr(index_module, "REBUILD_CHUNK", 1)
    assert dl.index._chunk()  # the oldest entry indexed again, the rest not yet
    assert redis.zscore(dl.index.ix.groups, rows[0][1][b"fp"]) == 1
    assert dl.discard([rows[0][0].decode()]) == 1  # the group's count reaches zero
    assert redis.exists(key)
    monkeypatch.setattr(index_module, "REBUILD_CHUNK", 1000)
    assert dl.index.rebuild().ready
    assert redis.exists(key)  # the sweep at the pass's end keeps the texts of a group with entries
    for eid, _ in rows[1:]:
        dead = dl.get(eid.decode())
        check_history(dead.errors, numbers[dead.job_id])
    assert dl.discard([eid.decode() for eid, _ in rows[1:]]) == N - 1
    assert not redis.exists(key)  # the index is whole again: the last entry takes the texts with it
    assert not redis.smembers(KEYS.dlq + ":tbgroups")
