"""The django.tasks backend against a real Redis-compatible server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import get_commands
from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

from chasqui_core.task import TASK_REGISTRY
from chasqui_core.task_runner import build_registry
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.worker.worker import Worker

from tests.helpers import keys_matching, run_until, subprocess_database_url

from . import sample_tasks

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = QueueKeys.for_queue("default")
EMAILS = QueueKeys.for_queue("emails")


@pytest.fixture(autouse=True)
def _clean(fresh_backend):
    sample_tasks.RUNS.clear()


def _stream_jobs(redis, keys=DEFAULT):
    return [decode(fields[b"j"]) for _, fields in redis.xrange(keys.stream)]


def _drain(redis_url, queues=("default",), until=lambda: True, timeout=20.0, **kwargs):
    """Run an in-process worker until ``until()`` holds (or the timeout passes)."""
    worker = Worker(list(queues), build_registry(), url=redis_url, install_signal_handlers=False,
                    promoter_poll_interval=0.02, **kwargs)

    run_until(worker, until, timeout)
    return worker


def test_our_runworker_wins_over_channels():
    assert get_commands()["runworker"] == "chasqui_core"


def test_a_result_built_slot_by_slot_equals_djangos_own():
    """task_result skips TaskResult's constructor; what it builds must be what the constructor builds."""
    from datetime import UTC, datetime

    from django.tasks import TaskResult
    from django.tasks.base import TaskError

    from chasqui_core.task_results import _SLOTS, task_result

    assert _SLOTS is not None  # this Django's TaskResult is the shape the fast path knows
    enqueued, started, attempted = (datetime(2026, 1, 2, 3, 4, second, tzinfo=UTC) for second in (5, 6, 7))
    errors = [TaskError(exception_class_path="app.Boom", traceback="Traceback...")]
    optional = dict(enqueued_at=enqueued, started_at=started, last_attempted_at=attempted, errors=errors,
                    worker_ids=["w1"])
    built = task_result(sample_tasks.add, "j1", TaskResultStatus.RUNNING, [1, [2]], {"k": "v"}, "default",
                        **optional)
    own = TaskResult(task=sample_tasks.add, id="j1", status=TaskResultStatus.RUNNING, finished_at=None,
                     args=[1, [2]], kwargs={"k": "v"}, backend="default", **optional)
    assert built == own
    assert (built.finished_at, built.errors, built.worker_ids) == (None, errors, ["w1"])
    bare = task_result(sample_tasks.add, "j2", TaskResultStatus.READY, [], {}, "default")
    assert (bare.errors, bare.worker_ids, bare.enqueued_at) == ([], [], None)
    assert bare.errors is not task_result(sample_tasks.add, "j3", TaskResultStatus.READY, [], {}, "default").errors


def test_enqueue_reaches_the_stream_with_the_task_path(redis):
    result = sample_tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    jobs = _stream_jobs(redis)
    assert [(j.id, j.task, j.args) for j in jobs] == [(result.id, "tests.django.sample_tasks.add", [2, 3])]


def test_a_worker_runs_enqueued_tasks(redis, redis_url):
    for i in range(20):
        sample_tasks.add.enqueue(i, 1)
    _drain(redis_url, until=lambda: len(sample_tasks.RUNS) >= 20)
    assert sorted(r[1] for r in sample_tasks.RUNS) == list(range(20))
    assert redis.xlen(DEFAULT.stream) == 0
    assert redis.xpending(DEFAULT.stream, "chasqui")["pending"] == 0


def test_async_tasks_run_on_the_loop(redis, redis_url):
    async def go():
        return await sample_tasks.async_double.aenqueue(21)

    result = asyncio.run(go())
    assert _stream_jobs(redis)[0].id == result.id
    _drain(redis_url, until=lambda: sample_tasks.RUNS)
    assert sample_tasks.RUNS == [("async_double", 21)]


def test_task_defaults_and_context_attempts(redis, redis_url):
    sample_tasks.flaky.enqueue("k", 2)
    _drain(redis_url, until=lambda: len(sample_tasks.RUNS) >= 3)
    assert [r[2] for r in sample_tasks.RUNS] == [1, 2, 3]
    assert redis.xlen(DEFAULT.dlq) == 0


def test_task_budget_from_decorator_then_dlq(redis, redis_url):
    sample_tasks.flaky.enqueue("k", 99)  # max_attempts=4 on the task
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1)
    assert len(sample_tasks.RUNS) == 4
    entry = redis.xrange(DEFAULT.dlq)[0][1]
    assert entry[b"reason"] == b"retries_exhausted"
    assert len(decode(entry[b"j"]).errors) == 4


def test_per_job_overrides_with_using(redis, redis_url):
    sample_tasks.flaky.using(attempts=2, backoff=5).enqueue("k", 99)
    job = _stream_jobs(redis)[0]
    assert job.max_attempts == 2 and job.backoff == {"strategy": "fixed", "initial_ms": 5, "jitter": "none"}
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1)
    assert len(sample_tasks.RUNS) == 2


def test_a_limit_key_given_with_using_travels_with_the_job(redis):
    sample_tasks.add.using(limit_key="acme").enqueue(1, 2)
    assert _stream_jobs(redis)[0].meta["limit_key"] == "acme"
    with pytest.raises(InvalidTask, match="limit_key must be a non-empty string"):
        sample_tasks.add.using(limit_key="")


def test_run_after_goes_through_the_delayed_set(redis):
    when = timezone.now() + timedelta(hours=1)
    result = sample_tasks.add.using(run_after=when).enqueue(1, 1)
    assert redis.xlen(DEFAULT.stream) == 0
    [(member, score)] = redis.zrange(DEFAULT.delayed, 0, -1, withscores=True)
    assert decode(member).id == result.id
    assert abs(score - when.timestamp() * 1000) < 2


def test_idempotent_enqueue_with_job_id(redis):
    first = sample_tasks.add.using(job_id="order-42").enqueue(1, 2)
    second = sample_tasks.add.using(job_id="order-42").enqueue(1, 2)
    assert first.id == second.id == "order-42"
    assert redis.xlen(DEFAULT.stream) == 1


def test_non_json_arguments_are_refused_and_nothing_is_enqueued(redis):
    with pytest.raises(TypeError, match="set"):
        sample_tasks.add.enqueue({1, 2}, 3)
    with pytest.raises(TypeError, match="datetime"):
        sample_tasks.add.enqueue(1, b=timezone.now())
    assert redis.xlen(DEFAULT.stream) == 0


def test_bad_task_options_are_refused():
    from django.tasks import task

    with pytest.raises(InvalidTask, match="max_attempts"):
        task(queue_name="default", max_attempts=0)(sample_tasks.add.func)
    with pytest.raises(InvalidTask, match="backoff"):
        task(queue_name="default", backoff="no-such-strategy")(sample_tasks.add.func)


def test_a_payload_naming_other_code_is_refused_never_imported(redis, redis_url):
    q = Queue("default", redis_client=redis)
    q.add("os.system", ["echo should-never-run"])
    q.add("tests.django.sample_tasks.add", [1, 2])
    assert "os.system" not in TASK_REGISTRY
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and sample_tasks.RUNS)
    entry = redis.xrange(DEFAULT.dlq)[0][1]
    assert entry[b"reason"] == b"unknown_task" and entry[b"task"] == b"os.system"
    assert sample_tasks.RUNS == [("add", 1, 2)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_transaction_on_commit_enqueues_only_after_commit(redis):
    from functools import partial

    with transaction.atomic():
        transaction.on_commit(partial(sample_tasks.add.enqueue, 1, 2))
        assert redis.xlen(DEFAULT.stream) == 0
    assert redis.xlen(DEFAULT.stream) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_transaction_rolled_back_never_enqueues(redis):
    from functools import partial

    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(partial(sample_tasks.add.enqueue, 1, 2))
        raise RuntimeError("roll back")
    time.sleep(0.1)
    assert redis.xlen(DEFAULT.stream) == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_transaction_enqueue_on_commit_option(redis, settings):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"ENQUEUE_ON_COMMIT": True}}}
    with transaction.atomic():
        result = sample_tasks.add.enqueue(5, 5)
        assert redis.xlen(DEFAULT.stream) == 0
    assert [j.id for j in _stream_jobs(redis)] == [result.id]
    with pytest.raises(RuntimeError), transaction.atomic():
        sample_tasks.add.enqueue(6, 6)
        raise RuntimeError("roll back")
    assert redis.xlen(DEFAULT.stream) == 1


def test_get_result_when_result_storage_is_on(redis, redis_url, settings):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"RESULT_TTL": 60}}}
    ok = sample_tasks.add.enqueue(20, 22)
    assert sample_tasks.add.get_result(ok.id).status == TaskResultStatus.READY
    bad = sample_tasks.flaky.using(attempts=2, backoff=5).enqueue("r", 99)
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and len(sample_tasks.RUNS) >= 3)
    done = sample_tasks.add.get_result(ok.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 42
    failed = sample_tasks.flaky.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["RuntimeError", "RuntimeError"]
    assert "flaky r failed on attempt 2" in failed.errors[-1].traceback
    ttl = redis.pttl(DEFAULT.result + ok.id)
    assert 0 < ttl <= 60_000


def test_get_result_is_refused_when_storage_is_off():
    with pytest.raises(NotImplementedError, match="RESULT_TTL"):
        sample_tasks.add.get_result("nope")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_runworker_command_runs_the_demo_task_from_the_view(redis, redis_url, client, django_user_model, tmp_path,
                                                            settings):
    """The example view enqueues on commit; `manage.py runworker emails default` runs it, and a job on the
    other queue (on a cluster, the two queues' keys are on different masters)."""
    settings.CHASQUI_DEMO = True
    from emails.models import Signup
    from emails.tasks import send_welcome_email

    response = client.post("/signup/", {"email": "ana@example.com"})
    assert response.status_code in (200, 302)
    signup = Signup.objects.get(email="ana@example.com")
    [job] = _stream_jobs(redis, EMAILS)
    assert job.task == "emails.tasks.send_welcome_email" and job.args == [signup.id]
    send_welcome_email.using(queue_name="default").enqueue(signup.id)

    db = subprocess_database_url()
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": db, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "manage.py", "runworker", "emails", "default", "--concurrency", "2"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def completed(keys) -> bool:
        return any(redis.hget(k, "completed") for k in keys_matching(redis, keys.second_counters + "*"))

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if completed(EMAILS) and completed(DEFAULT):
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Chasqui worker" in out
    for keys in (EMAILS, DEFAULT):
        assert completed(keys), f"no job completed on {keys.queue}"
        assert redis.xlen(keys.stream) == 0 and redis.xlen(keys.dlq) == 0
        assert redis.xpending(keys.stream, "chasqui")["pending"] == 0



def test_a_tasks_priority_picks_its_band_and_higher_runs_first(redis, redis_url):
    """Django's ``priority`` (-100…100) works: no InvalidTask, and a worker starts higher priorities first."""
    for i in range(3):
        sample_tasks.add.using(priority=-10).enqueue(i, 0)
    for i in range(3, 6):
        sample_tasks.add.enqueue(i, 0)
    for i in range(6, 9):
        sample_tasks.add.using(priority=100).enqueue(i, 0)
    assert [j.args[0] for j in _stream_jobs(redis)] == [3, 4, 5]
    assert [j.meta["priority"] for j in _stream_jobs(redis, DEFAULT.in_band("high"))] == [100] * 3
    _drain(redis_url, until=lambda: len(sample_tasks.RUNS) >= 9, concurrency=1)
    assert [r[1] for r in sample_tasks.RUNS] == [6, 7, 8, 3, 4, 5, 0, 1, 2]
    with pytest.raises(InvalidTask):
        sample_tasks.add.using(priority=101)
