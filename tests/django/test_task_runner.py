"""Django Tasks run by a worker: the signals Django promises, and what get_result() shows meanwhile."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished, task_started

from chasqui_core.engine.store.keys import QueueKeys

from . import sample_tasks
from .test_backend import _drain

DEFAULT = QueueKeys.for_queue("default")


@pytest.fixture(autouse=True)
def _clean(fresh_backend):
    sample_tasks.RUNS.clear()


@pytest.fixture
def received():
    """Every task signal a project receiver gets: (signal, task name, job id, status, finished_at, errors)."""
    seen: list[tuple] = []

    def record(name):
        def receiver(sender, task_result, **kwargs):
            seen.append((name, task_result.task.name, task_result.id, task_result.status, task_result.finished_at,
                         [e.exception_class_path for e in task_result.errors]))
        return receiver

    started, finished = record("started"), record("finished")
    task_started.connect(started)
    task_finished.connect(finished)
    yield seen
    task_started.disconnect(started)
    task_finished.disconnect(finished)


def test_a_success_sends_started_then_finished_with_finished_at(redis, redis_url, received):
    result = sample_tasks.add.enqueue(1, 2)
    _drain(redis_url, until=lambda: len(received) >= 2)
    assert [(s[0], s[2], s[3]) for s in received] == [
        ("started", result.id, TaskResultStatus.RUNNING), ("finished", result.id, TaskResultStatus.SUCCESSFUL)]
    assert received[0][4] is None and received[1][4] is not None


def test_a_retried_run_is_not_finished_and_the_last_failure_is(redis, redis_url, received):
    result = sample_tasks.always_fails.enqueue("k")
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and len(received) >= 4)
    assert [(s[0], s[3]) for s in received] == [
        ("started", TaskResultStatus.RUNNING), ("started", TaskResultStatus.RUNNING),
        ("started", TaskResultStatus.RUNNING), ("finished", TaskResultStatus.FAILED)]
    finished = received[-1]
    assert finished[2] == result.id and finished[4] is not None
    assert finished[5] == ["ValueError", "ValueError", "ValueError"]  # the whole history, this run included


def test_an_unrecoverable_error_finishes_the_job_on_its_first_run(redis, redis_url, received):
    sample_tasks.gives_up.enqueue()
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and len(received) >= 2)
    assert [(s[0], s[3]) for s in received] == [("started", TaskResultStatus.RUNNING),
                                                ("finished", TaskResultStatus.FAILED)]
    assert sample_tasks.RUNS == [("gives_up",)]


def test_async_task_signals_and_retry(redis, redis_url, received):
    result = sample_tasks.async_fails_once.enqueue("a")
    _drain(redis_url, until=lambda: len(received) >= 3)
    assert [(s[0], s[2], s[3]) for s in received] == [
        ("started", result.id, TaskResultStatus.RUNNING), ("started", result.id, TaskResultStatus.RUNNING),
        ("finished", result.id, TaskResultStatus.SUCCESSFUL)]


def test_a_tasks_context_shows_its_result_with_the_runs_before_it(redis, redis_url):
    """The context's TaskResult (built when the task first reads it) describes this run, as of its start."""
    result = sample_tasks.reads_its_result.enqueue("c")
    _drain(redis_url, until=lambda: sample_tasks.RUNS)
    [(_, attempt, job_id, status, attempts, errors, workers, started_at, read_at, same)] = sample_tasks.RUNS
    assert (attempt, job_id, status, attempts, errors, workers) == (
        2, result.id, TaskResultStatus.RUNNING, 2, ["ValueError"], 2)
    assert started_at <= read_at and same


@pytest.mark.django_db(transaction=True)
def test_a_sync_receiver_of_an_async_task_runs_off_the_event_loop(redis, redis_url):
    """A project's sync receiver may use the ORM: it must not run on the loop, where Django forbids that."""
    counts, errors = [], []

    def uses_the_orm(sender, task_result, **kwargs):
        try:
            counts.append(User.objects.count())
        except Exception as exc:  # SynchronousOnlyOperation on the loop
            errors.append(exc)

    task_started.connect(uses_the_orm)
    try:
        sample_tasks.async_double.enqueue(4)
        _drain(redis_url, until=lambda: counts or errors)
    finally:
        task_started.disconnect(uses_the_orm)
    assert errors == [] and counts == [0]


def test_an_async_receiver_is_awaited_for_every_job(redis, redis_url):
    seen = []

    async def on_finished(sender, task_result, **kwargs):
        seen.append((task_result.id, task_result.status))

    task_finished.connect(on_finished)
    try:
        ids = [sample_tasks.add.enqueue(i, i).id for i in range(3)] + [sample_tasks.async_double.enqueue(1).id]
        _drain(redis_url, until=lambda: len(seen) >= 4)
    finally:
        task_finished.disconnect(on_finished)
    assert sorted(seen) == sorted((i, TaskResultStatus.SUCCESSFUL) for i in ids)


def test_a_job_waiting_for_its_retry_is_ready_with_its_errors(redis, redis_url, settings):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"RESULT_TTL": 60}}}
    result = sample_tasks.fails_then_waits.enqueue("w")
    _drain(redis_url, until=lambda: redis.zcard(DEFAULT.delayed) == 1)
    waiting = sample_tasks.fails_then_waits.get_result(result.id)
    assert waiting.status == TaskResultStatus.READY
    assert waiting.finished_at is None
    assert [e.exception_class_path for e in waiting.errors] == ["RuntimeError"]
    assert "fails_then_waits w" in waiting.errors[0].traceback


def test_an_async_task_nobody_listens_to_still_fails_retries_and_succeeds(redis, redis_url):
    """With no receiver acting, the worker awaits the task's own coroutine: failures must still be retried."""
    sample_tasks.async_fails_once.enqueue("quiet")
    _drain(redis_url, until=lambda: len(sample_tasks.RUNS) >= 2 and redis.xlen(DEFAULT.stream) == 0)
    assert sample_tasks.RUNS == [("async_fails_once", "quiet")] * 2
    assert redis.xlen(DEFAULT.dlq) == 0 and redis.zcard(DEFAULT.delayed) == 0


def _task_lines(caplog, job_id: str) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage().rsplit("state=", 1)[-1]) for r in caplog.records
            if r.name == "django.tasks" and f"id={job_id} " in r.getMessage()]


def test_djangos_own_logging_sees_an_async_tasks_last_failure_and_no_success_at_warning(redis, redis_url, caplog):
    """At WARNING nothing logs a run, but the job that failed for good is logged at ERROR, once, with its traceback."""
    caplog.set_level(logging.WARNING, logger="django.tasks")
    ok = sample_tasks.async_double.enqueue(4)
    bad = sample_tasks.async_always_fails.enqueue("logged")
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and redis.xlen(DEFAULT.stream) == 0)
    assert sample_tasks.RUNS.count(("async_always_fails", "logged")) == 2
    assert _task_lines(caplog, ok.id) == []
    assert _task_lines(caplog, bad.id) == [("ERROR", "FAILED")]
    (record,) = [r for r in caplog.records if f"id={bad.id} " in r.getMessage()]
    assert record.exc_info and record.exc_info[0] is LookupError


def test_djangos_own_logging_sees_every_run_of_an_async_task_at_info(redis, redis_url, caplog):
    """A project that turns django.tasks up to INFO gets Django's start and finish lines for every job."""
    caplog.set_level(logging.INFO, logger="django.tasks")
    ok = sample_tasks.async_double.enqueue(5)
    bad = sample_tasks.async_always_fails.enqueue("info")
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and redis.xlen(DEFAULT.stream) == 0)
    assert _task_lines(caplog, ok.id) == [("INFO", "RUNNING"), ("INFO", "SUCCESSFUL")]
    assert _task_lines(caplog, bad.id) == [("INFO", "RUNNING"), ("INFO", "RUNNING"), ("ERROR", "FAILED")]


@pytest.mark.django_db(transaction=True)
def test_a_sync_tasks_database_connection_is_closed_after_its_job_as_after_a_request(redis, redis_url):
    """CONN_MAX_AGE is 0 here: as at the end of a request, the thread's connection must not outlive the job."""
    sample_tasks.counts_users.enqueue()
    sample_tasks.counts_users.enqueue()
    _drain(redis_url, until=lambda: len(sample_tasks.RUNS) == 2 and redis.xlen(DEFAULT.stream) == 0)
    wrappers = [run[1] for run in sample_tasks.RUNS]
    assert all(wrapper.connection is None for wrapper in wrappers)


def test_a_cancelled_task_is_finished_failed_with_job_cancelled(redis, redis_url, received):
    """Django hears ``task_finished`` for a job that ends cancelled: it is not retried."""
    from django.tasks import task_backends

    from chasqui_core.engine.settle.outcomes import CANCELLED_CLASS

    result = sample_tasks.patient.enqueue("c1")
    asked: list[bool] = []

    def until() -> bool:
        if not asked and sample_tasks.RUNS:
            task_backends["default"].queue("default").cancel(result.id)
            asked.append(True)
        return any(s[0] == "finished" for s in received)

    _drain(redis_url, until=until)
    [finished] = [s for s in received if s[0] == "finished"]
    assert finished[2] == result.id and finished[3] == TaskResultStatus.FAILED
    assert finished[5] == [CANCELLED_CLASS]
    assert sample_tasks.RUNS == [("patient", "c1")]
