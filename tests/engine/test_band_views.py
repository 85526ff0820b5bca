"""What operators read of a queue with priority bands: stats, the stream page, purge and running jobs.

A queue's prioritised jobs live in band streams of their own (keys.py,
priority.py); every reader outside the worker must see them all. Jobs are
added through ``Queue`` (which makes a band's stream and names it in the
queue's ``bands`` set) and delivered with a plain XREADGROUP, the way a
worker's read hands them out.
"""

from __future__ import annotations

import pytest

from chasqui_core.engine.ops import purge, stats, totals, waiting
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.ops.running_jobs import running_jobs


def fill(redis, name: str, counts: dict[int, int]) -> tuple[Queue, dict[int, list[str]]]:
    """Add ``counts[priority]`` jobs of each priority; the ids of each priority's entries, oldest first."""
    q = Queue(name, redis_client=redis)
    redis.xgroup_create(QueueKeys.for_queue(name).stream, GROUP, id="0", mkstream=True)
    added: dict[int, list[str]] = {}
    for priority, n in counts.items():
        added[priority] = [q.add("t", kwargs={"i": i}, priority=priority).entry_id for i in range(n)]
    return q, added


def deliver(redis, stream: str, n: int, consumer: str = "w-1") -> list[bytes]:
    reply = redis.xreadgroup(GROUP, consumer, {stream: ">"}, count=n)
    return [eid for eid, _ in reply[0][1]] if reply else []


def test_stats_sum_every_band_and_count_each_bands_waiting_jobs(redis):
    fill(redis, "b-stats", {5: 20, 0: 100, -3: 5})
    keys = QueueKeys.for_queue("b-stats")
    deliver(redis, keys.in_band("high").stream, 4)
    deliver(redis, keys.stream, 10)
    qs = stats.queue_stats(redis, "b-stats")
    assert qs.band_streams == ("high", "low")
    assert (qs.stream_length, qs.pending) == (125, 14)
    assert qs.bands == {"high": 16, "default": 90, "low": 5}
    assert list(qs.bands) == ["high", "default", "low"], "highest band first"
    assert qs.waiting == 111
    if qs.lag is not None:  # the server knows every group's lag (Redis 7+)
        assert qs.lag == 111


def test_stats_of_queues_with_and_without_bands_read_together(redis):
    fill(redis, "b-plain", {0: 3})
    fill(redis, "b-low", {-1: 2})
    plain, low, missing = stats.all_queue_stats(redis, ["b-plain", "b-low", "b-missing"])
    assert (plain.stream_length, plain.band_streams, plain.bands) == (3, (), {})
    assert (low.stream_length, low.band_streams, low.bands) == (2, ("low",), {"default": 0, "low": 2})
    assert (missing.stream_length, missing.bands) == (0, {})


def test_stats_leave_unknown_members_of_the_bands_set_out(redis):
    fill(redis, "b-odd", {0: 1})
    redis.sadd(QueueKeys.for_queue("b-odd").bands, "medium")
    qs = stats.queue_stats(redis, "b-odd")
    assert (qs.band_streams, qs.stream_length) == ((), 1)


def ids_of(page: waiting.StreamPage) -> list[tuple[str, str]]:
    return [(item.band, item.entry_id) for item in page.items]


@pytest.mark.parametrize("newest_first", [True, False])
def test_stream_pages_list_the_high_band_then_default_then_low_and_page_across_them(redis, newest_first):
    _, added = fill(redis, f"b-page-{newest_first}", {7: 3, 0: 4, -7: 2})
    name = f"b-page-{newest_first}"
    order = (lambda ids: list(reversed(ids))) if newest_first else list
    expected = ([("high", e) for e in order(added[7])] + [("", e) for e in order(added[0])]
                + [("low", e) for e in order(added[-7])])
    for limit in (1, 2, 3, 4, 9, 10):
        seen, cursor = [], None
        for _ in range(20):
            page = waiting.page(redis, name, cursor=cursor, limit=limit, newest_first=newest_first)
            assert len(page.items) <= limit
            seen += ids_of(page)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == expected, f"limit {limit}"
    first = waiting.page(redis, name, limit=3, newest_first=newest_first)
    assert first.next_cursor == f"high:{first.items[-1].entry_id}", "a cursor in a band names it"
    assert [i.priority for i in first.items] == [7, 7, 7]
    whole = waiting.page(redis, name, limit=50, newest_first=newest_first)
    assert {(i.band_label, i.priority) for i in whole.items} == {("high", 7), ("default", 0), ("low", -7)}
    assert whole.next_cursor is None


def test_stream_page_of_a_queue_without_bands_keeps_bare_entry_id_cursors(redis):
    _, added = fill(redis, "b-bare", {0: 5})
    page = waiting.page(redis, "b-bare", limit=2)
    assert page.next_cursor == added[0][3] and ":" not in page.next_cursor
    rest = waiting.page(redis, "b-bare", cursor=page.next_cursor, limit=10)
    assert [i.entry_id for i in rest.items] == list(reversed(added[0]))[2:]
    assert rest.next_cursor is None


def test_stream_page_marks_who_holds_each_bands_delivered_entries(redis):
    _, added = fill(redis, "b-held", {1: 2, 0: 2, -1: 2})
    keys = QueueKeys.for_queue("b-held")
    # entry ids repeat across streams: a holder must be matched by band, not by id alone
    deliver(redis, keys.in_band("high").stream, 1, "w-high")
    deliver(redis, keys.in_band("low").stream, 2, "w-low")
    page = waiting.page(redis, "b-held", limit=10, newest_first=False)
    held = {(i.band, i.entry_id): i.delivered_to for i in page.items}
    assert held == {("high", added[1][0]): "w-high", ("high", added[1][1]): None,
                    ("", added[0][0]): None, ("", added[0][1]): None,
                    ("low", added[-1][0]): "w-low", ("low", added[-1][1]): "w-low"}


@pytest.mark.parametrize("cursor", ["medium:1-0", "high:", "high:abc", "nonsense"])
def test_stream_page_refuses_a_cursor_it_did_not_give(redis, cursor):
    with pytest.raises(ValueError, match="start again without a cursor"):
        waiting.page(redis, "b-bad", cursor=cursor)


def test_purge_empties_every_band_keeps_delivered_and_later_jobs_and_counts_them(redis):
    q, added = fill(redis, "b-purge", {9: 30, 0: 40, -9: 25})
    keys = QueueKeys.for_queue("b-purge")
    held_high = deliver(redis, keys.in_band("high").stream, 3)
    held_default = deliver(redis, keys.stream, 5)
    assert purge.waiting_by_band(redis, keys) == {"high": 27, "default": 35, "low": 25}
    assert purge.waiting(redis, keys) == 87
    bounds = purge.newest_ids(redis, keys)
    assert bounds == {"high": added[9][-1], "": added[0][-1], "low": added[-9][-1]}
    late = [q.add("t", priority=p).entry_id for p in (9, 0, -9)]
    chunks: list[int] = []
    assert purge.purge_waiting(redis, keys, upto=bounds, chunk=10, progress=chunks.append) == 87
    assert chunks[-1] == 87 and chunks == sorted(chunks)
    assert [e for e, _ in redis.xrange(keys.in_band("high").stream)] == [*held_high, late[0].encode()]
    assert [e for e, _ in redis.xrange(keys.stream)] == [*held_default, late[1].encode()]
    assert [e.decode() for e, _ in redis.xrange(keys.in_band("low").stream)] == [late[2]]
    assert totals.read_totals(redis, ["b-purge"])["b-purge"].counters["purged"] == 87
    assert purge.waiting_by_band(redis, keys) == {"high": 1, "default": 1, "low": 1}
    assert purge.purge_waiting(redis, keys) == 3, "without bounds every band is emptied to its end"
    assert purge.waiting(redis, keys) == 0


def test_purge_bounds_refuse_an_unknown_band(redis):
    with pytest.raises(ValueError, match="unknown priority band"):
        purge.purge_waiting(redis, QueueKeys.for_queue("b-x"), upto={"medium": "+"})


def test_running_jobs_read_every_bands_journal_and_the_entry_from_its_band(redis):
    _, added = fill(redis, "b-run", {50: 1, 0: 1, -50: 1})
    keys = QueueKeys.for_queue("b-run")
    start = now_ms()
    # the same entry id can be in two bands' journals: each is read from its own stream
    for offset, band in enumerate(("low", "", "high")):
        k = keys.in_band(band)
        (entry,) = deliver(redis, k.stream, 1, "w-run")
        redis.hset(k.running("w-run"), entry, start + offset)
    page = running_jobs(redis, "w-run", ["b-run"])
    assert page.total == 3
    assert [(r.band_label, r.priority, r.entry_id) for r in page.items] == [
        ("low", -50, added[-50][0]), ("default", 0, added[0][0]), ("high", 50, added[50][0])]
    assert all(r.task == "t" and r.job_id for r in page.items)
    assert redis.exists(keys.in_band("high").running("w-run")) and keys.in_band("high").running("w-run").endswith(
        "running-high:w-run")
