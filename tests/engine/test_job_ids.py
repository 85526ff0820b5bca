"""What a job id may be (engine/jobs/job_ids.py): one rule, written once, for the engine and the API's schema."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest

from chasqui_core.engine.jobs import job_ids
from chasqui_core.engine.producer.queue import JobSpec, Queue


def test_the_written_out_ranges_are_the_unicode_tables_of_this_python():
    refused = re.compile(f"[{job_ids._REFUSED}]")
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue  # lone surrogates: refused by the engine's check, not namable in a schema
        expected = ch == "/" or (ch != " " and unicodedata.category(ch) in job_ids.REFUSED_CATEGORIES)
        assert bool(refused.fullmatch(ch)) == expected, f"U+{code:04X} {unicodedata.category(ch)}"


@pytest.mark.parametrize(
    "job_id",
    [
        "order-42",
        "schedule:nightly:1700000000000",
        "a b",
        "...",
        ".hidden",
        "ü✓",
        "x" * 200,
        "01JABCDEFGHJKMNPQRSTVWXYZ0",
    ],
)
def test_ids_a_url_can_address_are_taken(job_id):
    assert job_ids.check(job_id) == job_id


@pytest.mark.parametrize(
    "job_id",
    [
        "",
        ".",
        "..",
        "a/b",
        "/",
        "tab\t",
        "line\n",
        "nul\x00",
        "del\x7f",
        "c1\x85",
        "\u202eevil",
        "\u2066isolate",
        "zero\u200bwidth",
        "nbsp\u00a0",
        "\ufeffbom",
        "tag\U000e0041",
        "sep\u2028",
        "lone\ud800",
        "x" * 201,
    ],
)
def test_ids_that_no_url_could_address_or_that_hide_what_they_are_are_refused(job_id):
    with pytest.raises(ValueError, match="a job id is 1 to 200 characters, without '/'"):
        job_ids.check(job_id)


def test_a_non_string_id_is_refused_naming_its_type():
    with pytest.raises(ValueError, match="job_id must be a string.*got int"):
        job_ids.check(42)


def test_queue_build_refuses_such_an_id_before_anything_is_sent(redis):
    queue = Queue("ids", redis_client=redis)
    with pytest.raises(ValueError, match="job_id 'a/b' is not valid"):
        queue.add("t", [], job_id="a/b")
    with pytest.raises(ValueError, match="is not valid"):
        queue.build(JobSpec("t", job_id="right\u202eleft"))
    assert redis.keys("*ids*") == []
