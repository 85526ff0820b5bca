"""The job envelope a failed run writes back, and the error record it carries."""

from __future__ import annotations

from chasqui_core.engine.envelope import TRACEBACK_LIMIT, Job, decode, error_record, new_job_id


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
