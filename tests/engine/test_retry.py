"""retry.py's rules after a failed run: the worker-wide policy, the budget and backoff layers, and ``decide``.

Each rule is pinned at its boundary and by the layer that wins, so a change to
any comparison, default or message shows here (docs/testing.md: these run
under mutation testing).
"""

from __future__ import annotations

import pytest

from chasqui_core.engine.jobs.backoff import DEFAULT_BACKOFF, BackoffSpec, register_strategy
from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.jobs.errors import JobCancelled, RetryAfter, UnrecoverableError
from chasqui_core.engine.jobs.registry import Handler
from chasqui_core.engine.settle.retry import (DEFAULT_MAX_ATTEMPTS, Decision, RetryPolicy, backoff_for, budget,
                                              decide)

FIXED_250 = BackoffSpec(strategy="fixed", initial_ms=250, jitter="none")
FIXED_700 = BackoffSpec(strategy="fixed", initial_ms=700, jitter="none")
FIXED_900 = BackoffSpec(strategy="fixed", initial_ms=900, jitter="none")


def job(**fields) -> Job:
    return Job(id="j", task="t", created_at=1, **fields)


def handler(max_attempts: int | None = None, backoff: BackoffSpec | None = None) -> Handler:
    return Handler(name="t", fn=lambda: None, is_async=False, max_attempts=max_attempts, backoff=backoff)


class Unrecoverable(UnrecoverableError):
    pass


def test_the_worker_policy_defaults_to_three_runs_and_the_default_backoff():
    assert DEFAULT_MAX_ATTEMPTS == 3
    assert RetryPolicy() == RetryPolicy(3, DEFAULT_BACKOFF)
    assert RetryPolicy(1).max_attempts == 1


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3", None])
def test_the_worker_policy_refuses_a_budget_that_is_not_a_whole_number_of_runs(bad):
    with pytest.raises(ValueError) as caught:
        RetryPolicy(max_attempts=bad)
    assert str(caught.value) == f"max_attempts must be a whole number of 1 or more, got {bad!r}"


def test_the_budget_is_the_job_s_then_the_task_s_then_the_worker_s():
    policy = RetryPolicy(max_attempts=7)
    assert budget(job(max_attempts=2), handler(max_attempts=5), policy) == 2
    assert budget(job(), handler(max_attempts=5), policy) == 5
    assert budget(job(), handler(), policy) == 7
    assert budget(job(), None, policy) == 7
    assert budget(job(max_attempts=2), None, policy) == 2


def test_the_backoff_is_the_job_s_then_the_task_s_then_the_worker_s():
    policy = RetryPolicy(backoff=FIXED_900)
    assert backoff_for(job(backoff={"strategy": "fixed", "initial_ms": 250, "jitter": "none"}),
                       handler(backoff=FIXED_700), policy) == FIXED_250
    assert backoff_for(job(), handler(backoff=FIXED_700), policy) == FIXED_700
    assert backoff_for(job(), handler(), policy) == FIXED_900
    assert backoff_for(job(), None, policy) == FIXED_900
    assert backoff_for(job(backoff=250), None, policy) == BackoffSpec.fixed(250)


@pytest.mark.parametrize("unknown", [{"strategy": "from-a-newer-worker"}, {"initial_ms": "soon"}, [1, 2]])
def test_a_job_backoff_this_worker_cannot_read_falls_back_to_the_task_s_and_the_job_is_kept(unknown):
    policy = RetryPolicy(backoff=FIXED_900)
    assert backoff_for(job(backoff=unknown), handler(backoff=FIXED_700), policy) == FIXED_700
    assert backoff_for(job(backoff=unknown), None, policy) == FIXED_900


def test_a_cancelled_run_is_never_retried_whatever_its_budget():
    decision = decide(job(), JobCancelled(), 1, handler(max_attempts=10), RetryPolicy())
    assert decision == Decision(False, 0, "cancelled")


def test_an_unrecoverable_error_skips_the_budget_left():
    decision = decide(job(), Unrecoverable("gone"), 1, handler(max_attempts=10), RetryPolicy())
    assert decision == Decision(False, 0, "unrecoverable")


def test_the_run_that_spends_the_budget_is_the_last_and_the_one_before_it_retries():
    policy = RetryPolicy(max_attempts=3, backoff=FIXED_250)
    assert decide(job(), ValueError(), 3, None, policy) == Decision(False, 0, "retries_exhausted")
    assert decide(job(), ValueError(), 4, None, policy) == Decision(False, 0, "retries_exhausted")
    assert decide(job(), ValueError(), 2, None, policy) == Decision(True, 250, "")


def test_a_spent_budget_ends_even_a_run_that_asked_to_be_retried_later():
    assert decide(job(), RetryAfter(5), 3, None, RetryPolicy(3)) == Decision(False, 0, "retries_exhausted")


def test_a_retry_after_wait_is_honoured_to_the_millisecond_over_the_job_s_backoff():
    policy = RetryPolicy(backoff=FIXED_900)
    assert decide(job(backoff={"strategy": "fixed", "initial_ms": 250}), RetryAfter(1.5), 1, None,
                  policy) == Decision(True, 1500, "")
    assert decide(job(), RetryAfter(0.0004), 1, None, policy) == Decision(True, 0, "")
    assert decide(job(), RetryAfter(0.0006), 1, None, policy) == Decision(True, 1, "")


def test_the_wait_follows_the_backoff_at_the_number_of_runs_made():
    exponential = RetryPolicy(max_attempts=10, backoff=BackoffSpec(initial_ms=100, multiplier=2, jitter="none"))
    assert decide(job(), ValueError(), 1, None, exponential) == Decision(True, 100, "")
    assert decide(job(), ValueError(), 3, None, exponential) == Decision(True, 400, "")
    assert decide(job(), ValueError(), 3, handler(backoff=FIXED_700), exponential) == Decision(True, 700, "")


def test_decorrelated_jitter_grows_from_the_wait_the_last_failure_recorded():
    spec = BackoffSpec(jitter="decorrelated", initial_ms=100, max_ms=1_000_000)
    policy = RetryPolicy(max_attempts=10, backoff=spec)
    after_long_wait = job(attempt=1, errors=[{"class": "ValueError", "backoff_ms": 100_000}])
    first = job()
    waits = [decide(after_long_wait, ValueError(), 2, None, policy).delay_ms for _ in range(40)]
    assert all(100 <= w <= 300_000 for w in waits) and max(waits) > 300  # from the recorded 100 s, not from none
    assert all(100 <= decide(first, ValueError(), 1, None, policy).delay_ms <= 300 for _ in range(40))


def test_the_task_s_budget_ends_its_jobs_retries():
    assert decide(job(), ValueError(), 2, handler(max_attempts=2), RetryPolicy(5)) == Decision(False, 0,
                                                                                               "retries_exhausted")
    assert decide(job(), ValueError(), 2, handler(max_attempts=3, backoff=FIXED_250), RetryPolicy(5)) == Decision(
        True, 250, "")


def test_the_backoff_strategy_is_handed_the_error_the_run_raised():
    def by_error(spec: BackoffSpec, n: int, error: BaseException | None) -> float:
        return 5_000 if isinstance(error, TimeoutError) else 10

    register_strategy("test-by-error", by_error)
    policy = RetryPolicy(max_attempts=5, backoff=BackoffSpec(strategy="test-by-error", jitter="none"))
    assert decide(job(), TimeoutError(), 1, None, policy) == Decision(True, 5_000, "")
    assert decide(job(), ValueError(), 1, None, policy) == Decision(True, 10, "")
