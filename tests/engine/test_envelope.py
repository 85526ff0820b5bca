"""The job envelope: what a worker accepts, what a failed run writes back, and the error record it carries."""

from __future__ import annotations

import msgpack
import pytest

from chasqui_core.engine.jobs.envelope import (MAX_RESULT_TTL, TRACEBACK_LIMIT, DecodeError, Job, decode, error_record,
                                          new_job_id)

_GOOD = [1, "01JOB", "app.send", [1], {"k": "v"}, 0, 123, None, None, [], 0, 0, 0, {}]
"""A well-formed envelope, field by field (version first)."""


def _with(position: int, value) -> bytes:
    fields = list(_GOOD)
    fields[position] = value
    return msgpack.packb(fields)


def test_a_well_formed_envelope_decodes_to_its_job_and_an_empty_meta_reads_as_a_map():
    assert decode(msgpack.packb(_GOOD)) == Job("01JOB", "app.send", [1], {"k": "v"}, 0, 123)
    assert decode(_with(13, None)).meta == {}


@pytest.mark.parametrize(("payload", "says"), [
    (b"\xc1", "not a msgpack job envelope"),
    (msgpack.packb({"id": 1}), "expected a msgpack array"),
    (_with(0, 2), "unsupported envelope version 2"),
    (msgpack.packb(_GOOD[:13]), "13 fields, expected 14"),
    (_with(1, ""), "job id and task name must be non-empty strings"),
    (_with(2, 7), "job id and task name must be non-empty strings"),
    (_with(3, {"a": 1}), "args must be a list and kwargs a map"),
    (_with(4, [1]), "args must be a list and kwargs a map"),
    (_with(9, {}), "the error history must be a list and meta a map"),
    (_with(13, [1]), "the error history must be a list and meta a map"),
    (_with(5, -1), "attempt must be 0 or more, got -1"),
    (_with(6, "yesterday"), "created_at must be a whole number"),
    (_with(10, 1.5), "replays must be a whole number"),
    (_with(11, MAX_RESULT_TTL + 1), f"result_ttl must be between 0 and {MAX_RESULT_TTL}"),
    (_with(12, True), "deaths must be a whole number"),
    (_with(7, 0), "max_attempts must be empty or a whole number of 1 or more, got 0"),
    (_with(8, "fast"), "backoff must be empty or a map"),
    (_with(9, ["boom"]), "an error history entry is not a map"),
])
def test_a_malformed_envelope_is_refused_with_what_is_wrong_in_words(payload, says):
    with pytest.raises(DecodeError, match=says):
        decode(payload)


def _record(attempt: int, **extra) -> dict:
    return error_record(attempt=attempt, exc_class="ValueError", message=f"run {attempt} failed",
                        traceback="Traceback (most recent call last):\nValueError\n", worker="host:1:w",
                        started_at=1_000, finished_at=1_250, **extra)


def test_the_envelope_of_a_failed_run_is_the_job_with_one_more_error_and_its_new_counters():
    job = Job(new_job_id(), "app.send", [1, "two"], {"three": 3.5}, attempt=1, created_at=123, max_attempts=5,
              backoff={"strategy": "fixed", "initial_ms": 10, "jitter": "none"}, errors=[_record(1, backoff_ms=10)],
              replays=2, result_ttl=60, deaths=1, meta={"priority": 3})
    second = _record(2, backoff_ms=20)

    payload = job.encode_after_failure(3, second, 2)

    assert payload == job.after_failure(3, second, 2).encode()
    again = decode(payload)
    assert again == Job(job.id, "app.send", [1, "two"], {"three": 3.5}, 3, 123, 5, job.backoff,
                        [_record(1, backoff_ms=10), second], 2, 60, 2, {"priority": 3})
    assert job.errors == [_record(1, backoff_ms=10)] and job.attempt == 1, "the job it was made from is unchanged"


def test_an_error_record_names_its_backoff_only_when_a_retry_follows():
    retried, last = _record(1, backoff_ms=0), _record(2)

    assert retried["backoff_ms"] == 0 and "backoff_ms" not in last
    assert retried["duration_ms"] == 250
    assert error_record(attempt=1, exc_class="E", message="m", traceback="", worker="w", started_at=9,
                        finished_at=5)["duration_ms"] == 0, "a clock that stepped back gives no negative duration"


def test_an_error_record_cuts_a_long_message_and_the_middle_of_a_long_traceback():
    traceback = "head\n" + "x" * (3 * TRACEBACK_LIMIT) + "\ntail"
    record = error_record(attempt=1, exc_class="E", message="m" * 5_000, traceback=traceback, worker="w",
                          started_at=0, finished_at=0)

    assert record["message"] == "m" * 2_000
    assert record["traceback"].startswith("head\n") and record["traceback"].endswith("\ntail")
    assert "characters cut" in record["traceback"] and len(record["traceback"]) < TRACEBACK_LIMIT + 100
