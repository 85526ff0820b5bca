"""Retries end to end: budgets, backoff and the dead-letter queue, with real worker processes.

Gaps between runs are measured from the start times the handlers record; the
bounds are generous on the slow side, and exact on the fast side because a
retry may never run before its backoff has passed.
"""

import time

import pytest

from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.producer.queue import JobSpec, Queue
from tests.engine.worker_app import (
    RUNS_KEY,
    TASK_BACKOFF_MS,
    TASK_MAX_ATTEMPTS,
    dlq_entries,
    read_runs,
    runs_by_job,
    settled,
    wait_for,
)

ALWAYS = {"n": 1_000_000}
"""kwargs of a fail_n_times job that never succeeds."""


def runs_of(client, job_id, key=RUNS_KEY):
    return sorted((r for r in read_runs(client, key) if r.job_id == job_id), key=lambda r: r.at_ms)


def gaps_ms(runs):
    return [b.at_ms - a.at_ms for a, b in zip(runs, runs[1:], strict=False)]


@pytest.mark.timeout(60)
def test_job_failing_twice_runs_three_times_spaced_by_its_backoff(redis, workers):
    workers.start("r-three")
    workers.wait_ready(redis, "r-three", 1)
    job = Queue("r-three", redis_client=redis).add("fail_n_times", kwargs={"n": 2}, backoff=BackoffSpec.fixed(300))

    wait_for(lambda: len(runs_of(redis, job.job_id)) >= 3, 20, "three runs")
    wait_for(lambda: settled(redis, "r-three"), 10, "the queue to settle")
    runs = runs_of(redis, job.job_id)
    assert [r.attempt for r in runs] == [1, 2, 3]
    for gap in gaps_ms(runs):
        assert 300 <= gap < 300 + 1500, gaps_ms(runs)
    assert dlq_entries(redis, "r-three") == []


@pytest.mark.timeout(60)
def test_exponential_backoff_grows_from_one_retry_to_the_next(redis, workers):
    """Each retry must wait longer than the one before, or a failing dependency gets hammered.

    Jitter is off, so the recorded waits are exact: 100, 200, 400 and 800 ms. Every run must start
    at least its wait after the run before; no upper bound is needed to tell growth from a flat wait.
    """
    workers.start("r-grow")
    workers.wait_ready(redis, "r-grow", 1)
    spec = BackoffSpec(strategy="exponential", initial_ms=100, multiplier=2, jitter="none")
    q = Queue("r-grow", redis_client=redis)
    job = q.add("fail_n_times", kwargs=ALWAYS, attempts=5, backoff=spec)

    wait_for(lambda: redis.xlen(q.keys.dlq) == 1, 30, "the job to be dead-lettered")
    [entry] = dlq_entries(redis, "r-grow")
    waits = [record.get("backoff_ms") for record in decode(entry["j"]).errors]
    assert waits == [100, 200, 400, 800, None], "retry n waits initial * 2 ** (n - 1); none after the last run"

    runs = runs_of(redis, job.job_id)
    assert [r.attempt for r in runs] == [1, 2, 3, 4, 5]
    for wait, gap in zip(waits, gaps_ms(runs), strict=False):
        assert gap >= wait, f"a retry ran before its backoff had passed: gaps {gaps_ms(runs)}, waits {waits}"


@pytest.mark.timeout(60)
def test_job_options_beat_task_defaults_which_beat_worker_defaults(redis, workers):
    worker_backoff_ms = 400
    workers.start("r-layers", max_attempts=3, backoff_ms=worker_backoff_ms)
    workers.wait_ready(redis, "r-layers", 1)
    q = Queue("r-layers", redis_client=redis)
    spec = BackoffSpec(strategy="fixed", initial_ms=50)  # 50 ms +/- 100 ms of jitter, floored at 0
    job_level = q.add("fail_n_times_limited", kwargs=ALWAYS, attempts=4, backoff=spec)
    task_level = q.add("fail_n_times_limited", kwargs=ALWAYS)
    worker_level = q.add("fail_n_times", kwargs=ALWAYS)

    wait_for(lambda: redis.xlen(q.keys.dlq) >= 3, 30, "three jobs in the dead-letter queue")
    wait_for(lambda: settled(redis, "r-layers"), 10, "the queue to settle")
    time.sleep(0.2)
    by_job = runs_by_job(read_runs(redis))
    assert {job: len(runs) for job, runs in by_job.items()} == {
        job_level.job_id: 4, task_level.job_id: TASK_MAX_ATTEMPTS, worker_level.job_id: 3,
    }

    dead = {decode(e["j"]).id: (e, decode(e["j"])) for e in dlq_entries(redis, "r-layers")}
    assert {e["reason"] for e, _ in dead.values()} == {b"retries_exhausted"}

    entry, job = dead[job_level.job_id]
    assert job.max_attempts == 4, "the override survives every retry"
    assert job.backoff == spec.to_dict()
    assert [r["attempt"] for r in job.errors] == [1, 2, 3, 4]
    assert all(0 <= r["backoff_ms"] <= 150 for r in job.errors[:3]), [r.get("backoff_ms") for r in job.errors]
    assert "backoff_ms" not in job.errors[-1], "no retry after the last run"
    assert entry["error"] == b"planned failure 4 of 1000000"

    _, job = dead[task_level.job_id]
    assert job.max_attempts is None and job.backoff is None
    assert [r.get("backoff_ms") for r in job.errors] == [TASK_BACKOFF_MS, None]

    _, job = dead[worker_level.job_id]
    assert [r.get("backoff_ms") for r in job.errors] == [worker_backoff_ms, worker_backoff_ms, None]
    assert all(gap >= worker_backoff_ms for gap in gaps_ms(runs_of(redis, worker_level.job_id)))


@pytest.mark.timeout(60)
def test_unrecoverable_errors_skip_the_budget(redis, workers):
    workers.start("r-unrec", max_attempts=5)
    workers.wait_ready(redis, "r-unrec", 1)
    q = Queue("r-unrec", redis_client=redis)
    ours = q.add("unrecoverable", attempts=5)
    foreign = q.add("foreign_unrecoverable", attempts=5)

    wait_for(lambda: redis.xlen(q.keys.dlq) >= 2, 20, "both jobs in the dead-letter queue")
    wait_for(lambda: settled(redis, "r-unrec"), 10, "the queue to settle")
    time.sleep(0.2)
    assert {job: len(runs) for job, runs in runs_by_job(read_runs(redis)).items()} == {
        ours.job_id: 1, foreign.job_id: 1,
    }
    dead = {decode(e["j"]).id: e for e in dlq_entries(redis, "r-unrec")}
    assert {e["reason"] for e in dead.values()} == {b"unrecoverable"}
    assert dead[ours.job_id]["error_class"].endswith(b".BadInput")
    assert dead[foreign.job_id]["error_class"].endswith(b".UnrecoverableError")
    assert dead[foreign.job_id]["error_class"] != b"chasqui_core.engine.jobs.errors.UnrecoverableError"
    for entry in dead.values():
        [record] = decode(entry["j"]).errors
        assert record["attempt"] == 1 and "backoff_ms" not in record


@pytest.mark.timeout(150)
def test_ten_thousand_jobs_failing_once_each_run_exactly_twice(redis, workers):
    n = 10_000
    for _ in range(2):
        workers.start("r-bulk", visibility_ms=5000)
    workers.wait_ready(redis, "r-bulk", 2)
    added = Queue("r-bulk", redis_client=redis).add_bulk(
        [JobSpec("fail_n_times", [], {"n": 1}, backoff=BackoffSpec.fixed(1)) for _ in range(n)]
    )
    ids = {e.job_id for e in added}

    wait_for(lambda: redis.llen(RUNS_KEY) >= 2 * n, 120, f"{2 * n} runs")
    wait_for(lambda: settled(redis, "r-bulk"), 20, "the queue to settle")
    time.sleep(0.3)
    by_job = runs_by_job(read_runs(redis))
    assert set(by_job) == ids, "no job lost"
    wrong = {job: [r.attempt for r in runs] for job, runs in by_job.items()
             if sorted(r.attempt for r in runs) != [1, 2]}
    assert wrong == {}, f"{len(wrong)} jobs did not run exactly twice"
    assert dlq_entries(redis, "r-bulk") == []


@pytest.mark.timeout(60)
def test_short_backoff_is_not_floored_at_the_poll_interval(redis, workers):
    workers.start("r-short", poll=1.0)
    workers.wait_ready(redis, "r-short", 1)
    job = Queue("r-short", redis_client=redis).add("fail_n_times", kwargs={"n": 1}, backoff=BackoffSpec.fixed(5))

    wait_for(lambda: len(runs_of(redis, job.job_id)) >= 2, 20, "the second run")
    [gap] = gaps_ms(runs_of(redis, job.job_id))
    assert 5 <= gap < 500


@pytest.mark.timeout(60)
def test_a_long_backoff_does_not_hold_up_a_short_one(redis, workers):
    # The promoter is told about every retry it must look at early; a retry
    # due far away must not make it miss one due sooner.
    workers.start("r-mixed", poll=1.0)
    workers.wait_ready(redis, "r-mixed", 1)
    q = Queue("r-mixed", redis_client=redis)
    q.add("fail_n_times", kwargs={"n": 1, "log": "e2e:long"}, backoff=BackoffSpec.fixed(20_000))
    wait_for(lambda: redis.zcard(q.keys.delayed) == 1, 10, "the long retry to be scheduled")
    time.sleep(0.3)
    job = q.add("fail_n_times", kwargs={"n": 1}, backoff=BackoffSpec.fixed(5))

    wait_for(lambda: len(runs_of(redis, job.job_id)) >= 2, 15, "the short retry to run")
    [gap] = gaps_ms(runs_of(redis, job.job_id))
    assert 5 <= gap < 500
    assert len(read_runs(redis, "e2e:long")) == 1, "the long retry is not due yet"


@pytest.mark.timeout(60)
def test_retry_after_from_the_handler_sets_the_wait(redis, workers):
    workers.start("r-after")
    workers.wait_ready(redis, "r-after", 1)
    q = Queue("r-after", redis_client=redis)
    job = q.add("retry_after", kwargs={"seconds": 0.6, "n": 1})

    wait_for(lambda: len(runs_of(redis, job.job_id)) >= 2, 20, "the second run")
    wait_for(lambda: settled(redis, "r-after"), 10, "the queue to settle")
    [gap] = gaps_ms(runs_of(redis, job.job_id))
    assert 600 <= gap < 600 + 1500
