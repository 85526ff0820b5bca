"""retry.at_pickup, the attempt rules a job meets before it starts: each rule at its boundary."""

from __future__ import annotations

from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.settle.retry import (CLOCK_AHEAD_MS, PANIC_AFTER_DEATHS, RECOVERIES_BEFORE_PANIC, Refusal,
                                              at_pickup)

NOW = 1_800_000_000_000


def job(attempt: int = 0, deaths: int = 0, errors: list[str] | None = None, created_at: int = NOW) -> Job:
    history = [{"class": c, "message": "", "attempt": i + 1} for i, c in enumerate(errors or [])]
    return Job(id="j", task="t", attempt=attempt, deaths=deaths, errors=history, created_at=created_at)


def test_a_fresh_job_and_a_retry_within_its_budget_start():
    assert at_pickup(job(), 3, lost=0, now=NOW) is None
    assert at_pickup(job(2, errors=["ValueError", "ValueError"]), 3, lost=0, now=NOW) is None


def test_a_job_taken_back_from_too_many_workers_is_a_panic_and_one_fewer_is_not():
    refusal = at_pickup(job(), 3, lost=0, now=NOW, recovered=RECOVERIES_BEFORE_PANIC)
    assert refusal is not None and (refusal.reason, refusal.error_class) == ("panic", "WorkerLost")
    assert at_pickup(job(), 3, lost=0, now=NOW, recovered=RECOVERIES_BEFORE_PANIC - 1) is None


def test_a_lost_run_is_a_panic_only_at_the_deaths_that_make_a_poison_pill():
    refusal = at_pickup(job(2, deaths=PANIC_AFTER_DEATHS, errors=["WorkerLost"] * 2), 5, lost=1, now=NOW)
    assert refusal is not None and refusal.reason == "panic" and f"{PANIC_AFTER_DEATHS} times" in refusal.error
    assert at_pickup(job(1, deaths=PANIC_AFTER_DEATHS - 1, errors=["WorkerLost"]), 5, lost=1, now=NOW) is None


def test_a_lost_run_that_spent_the_budget_ends_it_with_the_way_it_was_lost():
    died = at_pickup(job(3, deaths=1, errors=["ValueError", "ValueError", "WorkerLost"]), 3, lost=1, now=NOW)
    assert died is not None and (died.reason, died.error_class) == ("retries_exhausted", "WorkerLost")
    cut_off = at_pickup(job(3, errors=["ValueError", "ValueError", "LostContact"]), 3, lost=1, now=NOW)
    assert cut_off is not None and (cut_off.reason, cut_off.error_class) == ("retries_exhausted", "LostContact")
    assert at_pickup(job(2, deaths=1, errors=["ValueError", "WorkerLost"]), 3, lost=1, now=NOW) is None


def test_a_retry_past_a_lowered_budget_is_exhausted_not_forged():
    refusal = at_pickup(job(3, errors=["ValueError"] * 3), 2, lost=0, now=NOW)
    assert refusal is not None and (refusal.reason, refusal.error_class) == ("retries_exhausted", "ValueError")
    assert "budget is now 2 runs" in refusal.error
    at_budget = at_pickup(job(2, errors=["ValueError"] * 2), 2, lost=0, now=NOW)
    assert at_budget is not None and at_budget.reason == "retries_exhausted"


def test_an_envelope_counting_runs_its_history_does_not_record_is_invalid_even_within_its_budget():
    refusal = at_pickup(job(2, errors=["ValueError"]), 5, lost=0, now=NOW)
    assert refusal is not None and (refusal.reason, refusal.error_class) == ("invalid", "InvalidEnvelope")
    assert at_pickup(job(1, errors=["ValueError"]), 5, lost=0, now=NOW) is None


def test_a_job_created_more_than_a_day_ahead_is_invalid_and_one_just_inside_is_not():
    ahead = at_pickup(job(created_at=NOW + CLOCK_AHEAD_MS + 1), 3, lost=0, now=NOW)
    assert ahead is not None and ahead.reason == "invalid" and "ahead" in ahead.error
    assert at_pickup(job(created_at=NOW + CLOCK_AHEAD_MS), 3, lost=0, now=NOW) is None


def test_each_refusal_says_in_words_what_happened_and_what_is_left():
    """What an operator reads in the dead-letter entry: the reason, the error class and the sentence, exactly."""
    assert at_pickup(job(), 3, lost=0, now=NOW, recovered=7) == Refusal(
        "panic", "WorkerLost", "the job was taken back from 7 workers that died or stopped answering while they "
                               "held it (one that kills its worker before it could be noted running?)")
    assert at_pickup(job(2, deaths=3, errors=["WorkerLost"] * 2), 5, lost=1, now=NOW) == Refusal(
        "panic", "WorkerLost", "the job was running when its worker died 3 times")
    assert at_pickup(job(3, errors=["ValueError", "ValueError", "LostContact"]), 3, lost=1, now=NOW) == Refusal(
        "retries_exhausted", "LostContact", "contact with its worker was lost during run 3 of 3; no run is left")
    assert at_pickup(job(3, deaths=1, errors=["ValueError", "ValueError", "WorkerLost"]), 3, lost=1,
                     now=NOW) == Refusal("retries_exhausted", "WorkerLost",
                                         "its worker died during run 3 of 3; no run is left")
    assert at_pickup(job(2, errors=["ValueError"]), 5, lost=0, now=NOW) == Refusal(
        "invalid", "InvalidEnvelope", "the envelope says 2 runs were made, and its error history records 1")
    assert at_pickup(job(created_at=NOW + CLOCK_AHEAD_MS + 1), 3, lost=0, now=NOW) == Refusal(
        "invalid", "InvalidEnvelope",
        f"created_at {NOW + CLOCK_AHEAD_MS + 1} is more than a day ahead of this worker's clock ({NOW})")


def test_a_budget_lowered_under_the_runs_made_names_the_last_error_or_says_the_retries_are_exhausted():
    lowered = at_pickup(job(2, errors=["ValueError", "KeyError"]), 1, lost=0, now=NOW)
    assert lowered == Refusal("retries_exhausted", "KeyError",
                              "its budget is now 1 runs and it has made 2: no run is left "
                              "(the budget was lowered since it was retried)")
    unnamed = Job(id="j", task="t", attempt=1, errors=[{"message": "no class"}], created_at=NOW)
    assert at_pickup(unnamed, 1, lost=0, now=NOW).error_class == "RetriesExhausted"
    blank = Job(id="j", task="t", attempt=1, errors=[{"class": ""}], created_at=NOW)
    assert at_pickup(blank, 1, lost=0, now=NOW).error_class == "RetriesExhausted"
    assert at_pickup(job(), 0, lost=0, now=NOW).error_class == "RetriesExhausted", "no run made: no last error"


def test_a_lost_run_with_no_history_ends_as_its_worker_lost_and_recoveries_default_to_none():
    bare = Job(id="j", task="t", attempt=1, errors=[], created_at=NOW)
    assert at_pickup(bare, 1, lost=1, now=NOW) == Refusal("retries_exhausted", "WorkerLost",
                                                          "its worker died during run 1 of 1; no run is left")
    assert at_pickup(job(), 3, lost=0, now=NOW) is None and RECOVERIES_BEFORE_PANIC > 1
