"""Browsing the dead-letter queue against a real server: pages, filters, error groups, finding a job.

The entries are written the way settle.lua writes them (tests/engine/dlq_entries.py).
"""

import pytest

from chasqui_core.engine.dlq.entries import REASONS
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.fingerprint import fingerprint
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.errors import JobNotFound
from tests.engine.dlq_entries import KEYS, Q, add_dead, bulk_dead, dead_job, fields_for


@pytest.fixture
def dl(redis):
    return DeadLetters(redis, Q)


# --- browsing ----------------------------------------------------------------------


def test_count_and_pages_newest_first_without_skips_or_repeats(redis, dl):
    bulk_dead(redis, 1234)
    expected = [eid.decode() for eid, _ in redis.xrevrange(KEYS.dlq)]
    assert dl.count() == 1234
    seen, sizes, cursor = [], [], None
    while True:
        page = dl.page(cursor=cursor, limit=100)
        assert page.scanned == len(page.items), "an unfiltered page reads only what it shows, whatever the size"
        seen += [d.entry_id for d in page.items]
        sizes.append(len(page.items))
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == expected
    assert sizes == [100] * 12 + [34]
    assert dl.page(cursor=expected[-1]).items == []


def test_filtered_pages_carry_on_where_the_scan_stopped(redis, dl):
    pipe = redis.pipeline(transaction=False)
    for i in range(1000):
        pipe.xadd(KEYS.dlq, fields_for(dead_job("reports.build" if i % 7 == 0 else "emails.send")))
    pipe.execute()
    expected = [eid.decode() for eid, f in redis.xrevrange(KEYS.dlq) if f[b"task"] == b"reports.build"]
    f = DLQFilter(task="reports.build")
    for limit, scan_limit in ((20, 20_000), (50, 150)):
        seen, cursor, pages = [], None, 0
        while True:
            page = dl.page(cursor=cursor, limit=limit, filter=f, scan_limit=scan_limit)
            assert page.scanned <= scan_limit and len(page.items) <= limit
            assert all(d.task == "reports.build" for d in page.items)
            seen += [d.entry_id for d in page.items]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == expected
        assert pages >= len(expected) // limit
    # the index walks only the task's own entries, not the 1,000 in the stream
    assert dl.page(filter=f, limit=1000).scanned == len(expected)


def test_get_missing_and_malformed_ids(redis, dl):
    eid = add_dead(redis, dead_job())
    assert dl.get(eid).entry_id == eid
    with pytest.raises(JobNotFound, match="No dead-letter entry 1-0"):
        dl.get("1-0")
    for bad in ("abc", "12", "1-2-3", "", "99999999999999999999999-0", "1-0\n"):
        with pytest.raises(ValueError, match="not a valid dead-letter entry id"):
            dl.get(bad)
    with pytest.raises(ValueError, match="cursor"):
        dl.page(cursor="tomorrow")


def test_filters_on_every_field(redis, dl):
    t0 = 1_700_000_000_000
    history = ("Connection RESET by peer", "timeout after 30s")
    e = {
        "a": add_dead(redis, dead_job("emails.send", messages=("bad address",), cls="ValueError"),
                      entry_id=f"{t0}-0"),
        "b": add_dead(redis, dead_job("emails.send", messages=history, cls="myapp.errors.ValueError"),
                      entry_id=f"{t0 + 1000}-0"),
        "c": add_dead(redis, dead_job("reports.build", messages=("no such key",), cls="KeyError"),
                      "unrecoverable", entry_id=f"{t0 + 1000}-1"),
        "d": add_dead(redis, dead_job("reports.build", messages=()), "unknown_task", error_class="UnknownTask",
                      error="no task named 'reports.build'", entry_id=f"{t0 + 2000}-0"),
        "e": add_dead(redis, dead_job("media.cut"), lua_panic=True, entry_id=f"{t0 + 3000}-0"),
        "f": add_dead(redis, None, "decode_failed", payload=b"\xc1garbage", error_class="DecodeError",
                      error="not a msgpack job envelope", entry_id=f"{t0 + 4000}-0"),
    }
    cases = [
        (DLQFilter(), "abcdef"),
        (DLQFilter(task="emails.send"), "ab"),
        (DLQFilter(task="media.cut"), "e"),  # only in the envelope: the entry has no task field
        (DLQFilter(reason="unrecoverable"), "c"),
        (DLQFilter(reason="panic"), "e"),
        (DLQFilter(error_class="ValueError"), "ab"),
        (DLQFilter(error_class="myapp.errors.ValueError"), "b"),
        (DLQFilter(error_class="errors.ValueError"), ""),
        (DLQFilter(error_text="connection reset"), "b"),  # in the history, not the last message
        (DLQFilter(error_text="TIMEOUT"), "b"),
        (DLQFilter(error_text="died 2 times"), "e"),
        (DLQFilter(since_ms=t0 + 1000), "cdefb"),
        (DLQFilter(until_ms=t0 + 1000), "a"),
        (DLQFilter(since_ms=t0 + 1000, until_ms=t0 + 2001), "bcd"),
        (DLQFilter(since_ms=t0 + 1000, until_ms=t0 + 1000), ""),
        (DLQFilter(task="emails.send", error_text="bad", until_ms=t0 + 1), "a"),
    ]
    everything = [dl.get(eid) for eid in e.values()]
    for f, names in cases:
        want = {e[n] for n in names}
        assert {d.entry_id for d in everything if f.matches(d)} == want, f
        assert {d.entry_id for d in dl.page(filter=f, limit=100).items} == want, f
        assert dl.count_matching(f) == len(want), f
    assert [d.entry_id for d in dl.page(filter=DLQFilter(since_ms=t0 + 1000, until_ms=t0 + 2001)).items] == \
        [e["d"], e["c"], e["b"]]
    undecodable = dl.get(e["f"])
    assert undecodable.job is None and undecodable.errors == [] and undecodable.payload == b"\xc1garbage"


def test_filter_validation_and_round_trip():
    with pytest.raises(ValueError) as info:
        DLQFilter.from_dict({"reason": "exploded"})
    assert all(reason in str(info.value) for reason in REASONS)
    with pytest.raises(ValueError, match="since_ms .* is after until_ms"):
        DLQFilter.from_dict({"since_ms": 10, "until_ms": 5})
    with pytest.raises(ValueError, match="'colour'"):
        DLQFilter.from_dict({"colour": "red"})
    with pytest.raises(ValueError, match="epoch milliseconds"):
        DLQFilter.from_dict({"since_ms": "yesterday"})
    f = DLQFilter(task="emails.send", error_text="Timeout", since_ms=5)
    assert f.to_dict() == {"task": "emails.send", "error_text": "Timeout", "since_ms": 5}
    assert DLQFilter.from_dict(f.to_dict()) == f
    assert DLQFilter.from_dict({"task": "", "reason": "", "since_ms": "12", "until_ms": ""}) == DLQFilter(since_ms=12)
    assert DLQFilter(task="  ").is_empty() and not f.is_empty()


def test_fingerprint_merges_messages_that_differ_in_values():
    assert fingerprint("LookupError", "user 123 not found") == fingerprint("LookupError", "user 456 not found")
    assert fingerprint("LookupError", "user 123 not found") != fingerprint("KeyError", "user 123 not found")
    assert fingerprint("E", "order 'A-17' of 550e8400-e29b-41d4-a716-446655440000 at 0x7f3a") == \
        fingerprint("E", 'order "B-9" of 6ba7b810-9dad-11d1-80b4-00c04fd430c8 at 0x10')
    assert fingerprint("E", "can't open file") == "E: can't open file"
    assert fingerprint("E", "row 1 failed") != fingerprint("E", "column 1 failed")
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"
    assert fingerprint("E", long_a) != fingerprint("E", long_b) and len(fingerprint("E", long_a)) < 230


def test_groups(redis, dl):
    t0 = 1_700_000_000_000
    rows = [
        ("accounts.sync", "user 123 not found", t0), ("accounts.sync", "user 456 not found", t0 + 10),
        ("billing.charge", "user 789 not found", t0 + 20), ("accounts.sync", "timeout after 30s", t0 + 30),
        ("billing.charge", "user 1 not found", t0 + 40),
    ]
    for task, message, ms in rows:
        add_dead(redis, dead_job(task, messages=(message,), cls="LookupError"), entry_id=f"{ms}-0")
    groups = dl.groups()
    assert [(g.fingerprint, g.count) for g in groups] == [
        ("LookupError: user <n> not found", 4), ("LookupError: timeout after <n>s", 1)]
    top = groups[0]
    assert (top.first_seen_ms, top.last_seen_ms) == (t0, t0 + 40)
    assert (top.sample_message, top.sample_entry_id) == ("user 1 not found", f"{t0 + 40}-0")
    assert top.tasks == ["accounts.sync", "billing.charge"]
    only = dl.groups(DLQFilter(task="billing.charge"))
    assert [(g.count, g.tasks) for g in only] == [(2, ["billing.charge"])]
    # the whole DLQ is grouped from its index; a filter the index cannot answer groups the newest scan_limit
    assert [(g.count, g.first_seen_ms) for g in dl.groups(scan_limit=3)] == [(4, t0), (1, t0 + 30)]
    assert [(g.count, g.first_seen_ms) for g in dl.groups(DLQFilter(error_text="o"), scan_limit=3)] == [
        (2, t0 + 20), (1, t0 + 30)]
    assert dl.page(limit=1).items[0].fingerprint == top.fingerprint


def test_find_by_job_id_returns_the_newest_entry(redis, dl):
    job = dead_job()
    add_dead(redis, job)
    newer = add_dead(redis, job)
    add_dead(redis, dead_job())
    assert dl.find_by_job_id(job.id).entry_id == newer
    assert dl.find_by_job_id("nope") is None
