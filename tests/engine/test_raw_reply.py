"""Raw replies (store/raw_reply.py) against a real server: what the text search reads a chunk of the DLQ with."""

import pytest
import redis as redis_py

from chasqui_core.engine.dlq.search import TextSearch
from chasqui_core.engine.jobs.envelope import Job, new_job_id, now_ms
from chasqui_core.engine.store.raw_reply import RawReplies, parse, stream_range_tail
from tests.engine.dlq_entries import KEYS, Q, add_dead, bulk_dead, err

FAKE_TAIL = b"\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nj\r\n$1\r\nx"
"""A value that ends like an entry of an XRANGE reply, whose last bulk string the value's own end completes: it
parses to the reply's end, and only the stream's own entry may pass for the last one."""


def test_a_range_read_raw_parses_to_what_redis_py_reads_and_its_tail_names_the_last_entry(redis):
    bulk_dead(redis, 30)
    replies = RawReplies(redis, KEYS.dlq)
    raw = replies.call(b"XREVRANGE", KEYS.dlq.encode(), b"+", b"-", b"COUNT", b"12")
    rows = parse(raw)
    assert [(eid, dict(zip(f[::2], f[1::2], strict=True))) for eid, f in rows] == \
        redis.xrevrange(KEYS.dlq, "+", "-", 12)
    assert stream_range_tail(raw, _confirm(replies)) == (12, rows[-1][0])
    empty = RawReplies(redis, "nothing").call(b"XRANGE", b"nothing", b"-", b"+")
    assert stream_range_tail(empty, _confirm(replies)) == (0, None)
    # the borrowed connection went back clean: the pool's next commands read their own replies
    assert redis.xlen(KEYS.dlq) == 30 and redis.get("nothing") is None


def test_a_value_that_looks_like_an_entry_header_is_never_taken_for_the_last_entry(redis):
    redis.xadd(KEYS.dlq, {"j": b"y"}, id="1-1")  # the id the fake header names, with other bytes
    bulk_dead(redis, 3)
    spoof = redis.xadd(KEYS.dlq, {"j": b"payload", "error": b"boom" + FAKE_TAIL})
    replies = RawReplies(redis, KEYS.dlq)
    raw = replies.call(b"XRANGE", KEYS.dlq.encode(), b"-", b"+")
    assert raw.endswith(FAKE_TAIL + b"\r\n")
    assert stream_range_tail(raw, _confirm(replies)) == (5, spoof)


def _confirm(replies: RawReplies):
    return lambda eid, entry: replies.holds_entry(KEYS.dlq.encode(), eid, entry)


def test_an_error_reply_is_raised_in_words_and_the_connection_stays_usable(redis):
    redis.set("a-string", "x")
    with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"):
        RawReplies(redis, "a-string").call(b"XRANGE", b"a-string", b"-", b"+")
    assert redis.get("a-string") == b"x"


def test_a_search_goes_on_from_the_right_entry_when_a_chunk_ends_in_a_spoofed_header(redis):
    bulk_dead(redis, 10)
    needle = add_dead(redis, Job(new_job_id(), "emails.send", ["zx-needle"], {}, created_at=now_ms(),
                                 errors=[err("boom")]))
    bulk_dead(redis, 10)
    for _ in range(5):  # entries whose last field ends like a header, one at the end of each chunk below
        redis.xadd(KEYS.dlq, {"j": b"payload", "error": b"boom" + FAKE_TAIL})
    search = TextSearch(redis, Q)
    for chunk in (1, 2, 3, 5, 7):
        cursor, found, scanned = None, [], 0
        while True:
            page = search.search("ZX-needle", cursor=cursor, chunk=chunk, scan_limit=chunk, time_limit=30)
            found += [d.entry_id for d in page.items]
            scanned += page.scanned
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert (found, scanned) == ([needle], 26), chunk


def test_a_search_that_fills_its_page_reads_the_chunk_it_sent_for_and_leaves_the_connection_clean(redis):
    bulk_dead(redis, 30)
    needles = [add_dead(redis, Job(new_job_id(), "emails.send", ["zx-needle"], {}, created_at=now_ms(),
                                   errors=[err("boom")])) for _ in range(2)]
    page = TextSearch(redis, Q).search("zx-needle", limit=1, chunk=5, time_limit=30)
    assert [d.entry_id for d in page.items] == [needles[1]] and page.next_cursor == needles[0]
    # the next chunk was on its way when the page filled: it was read, so the pool's next commands read their own
    assert redis.xlen(KEYS.dlq) == 32 and redis.get("nothing") is None
    assert redis.xrevrange(KEYS.dlq, count=1)[0][0].decode() == needles[1]
