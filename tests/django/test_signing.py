"""Signed jobs and execution idempotency through Django: settings, checks, every enqueue path, runworker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

from chasqui_core import checks
from chasqui_core.conf import load
from chasqui_core.engine.ops import totals
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.jobs.idempotency import IDEMPOTENCY_KEY, IDEMPOTENCY_TTL
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.signing import SIGNATURE, Signer
from chasqui_core.engine.worker.worker import Worker
from chasqui_core.models import OutboxEntry
from chasqui_core.outbox import relay
from chasqui_core.task_runner import build_registry
from tests.engine.worker_app import wait_for
from tests.helpers import ROOT, run_until
from tests.supervisor.app import NAP, QUEUE, STARTED

from . import sample_tasks

DEFAULT = QueueKeys.for_queue("default")
CURRENT = "current-" + "c" * 40
OLDER = "older-" + "o" * 40


@pytest.fixture(autouse=True)
def _clean(fresh_backend):
    sample_tasks.RUNS.clear()


@pytest.fixture
def signing(settings, redis_url):
    settings.CHASQUI = {"REDIS_URL": redis_url, "SIGNING_KEYS": [CURRENT, OLDER], "IDEMPOTENCY_TTL": 3600}


def _stream_jobs(redis, keys=DEFAULT):
    return [decode(fields[b"j"]) for _, fields in redis.xrange(keys.stream)]


def _signed_with_current(job) -> bool:
    return Signer([CURRENT]).verify(job) and not Signer([OLDER]).verify(job)


# --- settings and checks -----------------------------------------------------------------------------------------


def test_signing_keys_and_the_idempotency_ttl_are_validated_naming_the_setting():
    keys = load({"SIGNING_KEYS": [CURRENT, OLDER.encode()]}).SIGNING_KEYS
    assert keys == (CURRENT.encode(), OLDER.encode()), "text keys are taken as UTF-8"
    assert load({"SIGNING_KEYS": None}).SIGNING_KEYS == () and load({}).SIGNING_KEYS == ()
    for value, words in (("one-key-as-a-string", r"settings.CHASQUI\['SIGNING_KEYS'\] must be a list"),
                         ([CURRENT, ""], r"settings.CHASQUI\['SIGNING_KEYS'\]\[1\] is empty"),
                         ([CURRENT, 7], r"settings.CHASQUI\['SIGNING_KEYS'\]\[1\] must be a string or bytes")):
        with pytest.raises(ImproperlyConfigured, match=words):
            load({"SIGNING_KEYS": value})
    assert load({"IDEMPOTENCY_TTL": 60}).IDEMPOTENCY_TTL == 60
    for value in (0, "3600", True):
        with pytest.raises(ImproperlyConfigured, match=r"settings.CHASQUI\['IDEMPOTENCY_TTL'\] must be"):
            load({"IDEMPOTENCY_TTL": value})


def test_the_system_check_warns_when_debug_is_off_and_jobs_are_unsigned(settings):
    settings.DEBUG = False
    settings.CHASQUI = {}
    assert [m.id for m in checks.signing_keys()] == ["chasqui.security.W001"]
    settings.CHASQUI = {"SIGNING_KEYS": [CURRENT, "short"]}
    [short] = checks.signing_keys()
    assert short.id == "chasqui.security.W002" and "['SIGNING_KEYS'][1] is 5 bytes long" in short.msg
    settings.CHASQUI = {"SIGNING_KEYS": [CURRENT]}
    assert checks.signing_keys() == []
    settings.DEBUG = True
    settings.CHASQUI = {}
    assert checks.signing_keys() == []


# --- every enqueue path signs ---------------------------------------------------------------------------------------


def test_enqueue_and_enqueue_many_sign_with_the_first_key(signing, redis):
    one = sample_tasks.add.enqueue(1, 2)
    many = sample_tasks.add.enqueue_many([((i, i), {}) for i in range(3)])
    asyncio.run(sample_tasks.add.aenqueue(3, 4))
    jobs = _stream_jobs(redis)
    assert [j.id for j in jobs][:4] == [one.id, *[r.id for r in many]]
    assert len(jobs) == 5 and all(_signed_with_current(j) for j in jobs)


@pytest.mark.django_db(transaction=True)
def test_delayed_and_on_commit_enqueues_are_signed(signing, redis, settings):
    sample_tasks.add.using(run_after=timezone.now() + timedelta(minutes=5)).enqueue(1, 1)
    [member] = redis.zrange(DEFAULT.delayed, 0, -1)
    assert _signed_with_current(decode(member))
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"ENQUEUE_ON_COMMIT": True}}}
    with transaction.atomic():
        sample_tasks.add.enqueue(2, 2)
    [job] = _stream_jobs(redis)
    assert _signed_with_current(job)


@pytest.mark.django_db(transaction=True)
def test_jobs_relayed_from_the_outbox_are_signed_when_staged(signing, redis, redis_url, settings):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"OUTBOX": True}}}
    with transaction.atomic():
        relayed_now = sample_tasks.add.enqueue(1, 2)
    # staged while Redis was unreachable, relayed later by the relay every worker runs
    settings.CHASQUI = {**settings.CHASQUI, "REDIS_URL": "redis://127.0.0.1:1/0"}
    with transaction.atomic():
        relayed_later = sample_tasks.add.enqueue(3, 4)
    assert OutboxEntry.objects.filter(job_id=relayed_later.id).exists()
    settings.CHASQUI = {**settings.CHASQUI, "REDIS_URL": redis_url}
    assert relay(task_backends["default"].queue) == 1
    jobs = _stream_jobs(redis)
    assert [j.id for j in jobs] == [relayed_now.id, relayed_later.id]
    assert all(_signed_with_current(j) for j in jobs)


# --- task.using(idempotency_key=...) ----------------------------------------------------------------------------------


def test_using_idempotency_key_puts_the_key_and_its_lifetime_in_the_signed_envelope(signing, redis):
    sample_tasks.add.using(idempotency_key="sum-1").enqueue(1, 2)
    sample_tasks.add.using(idempotency_key=True, job_id="sum-2").enqueue(2, 3)
    sample_tasks.add.using(idempotency_key="sum-3", idempotency_ttl=60).enqueue(3, 4)
    many = sample_tasks.add.using(idempotency_key=True).enqueue_many([((1, 1), {}), ((2, 2), {})])
    jobs = _stream_jobs(redis)
    assert [(j.meta[IDEMPOTENCY_KEY], j.meta[IDEMPOTENCY_TTL]) for j in jobs] == [
        ("sum-1", 3600), ("sum-2", 3600), ("sum-3", 60), (many[0].id, 3600), (many[1].id, 3600)]
    assert all(_signed_with_current(j) and SIGNATURE in j.meta for j in jobs)
    with pytest.raises(ValueError, match="with enqueue_many.. of several calls, use idempotency_key=True"):
        sample_tasks.add.using(idempotency_key="one-key").enqueue_many([((1, 1), {}), ((2, 2), {})])
    for bad in ({"idempotency_key": ""}, {"idempotency_key": 5}, {"idempotency_ttl": 0}):
        with pytest.raises(InvalidTask):
            sample_tasks.add.using(**bad)
    assert redis.xlen(DEFAULT.stream) == 5


def test_a_duplicate_reports_successful_and_runs_once(signing, redis, redis_url, settings):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"RESULT_TTL": 60}}}
    first = sample_tasks.add.using(idempotency_key="sum-of-20-and-22").enqueue(20, 22)
    _drain(redis_url, until=lambda: redis.exists(DEFAULT.done + "sum-of-20-and-22"))
    again = sample_tasks.add.using(idempotency_key="sum-of-20-and-22").enqueue(20, 22)
    assert sample_tasks.add.get_result(again.id).status == TaskResultStatus.READY
    _drain(redis_url, until=lambda: totals.read_totals(redis, ["default"])["default"].counters["skipped"] == 1)
    assert sample_tasks.RUNS == [("add", 20, 22)]
    done = sample_tasks.add.get_result(first.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 42
    skipped = sample_tasks.add.get_result(again.id)
    assert skipped.status == TaskResultStatus.SUCCESSFUL and skipped.return_value is None


def _drain(redis_url, until, timeout=20.0):
    """An in-process worker with the project's settings, until ``until()`` holds."""
    from chasqui_core.conf import chasqui_settings

    worker = Worker(["default"], build_registry(), url=redis_url, install_signal_handlers=False,
                    promoter_poll_interval=0.02, signing_keys=chasqui_settings().SIGNING_KEYS)

    run_until(worker, until, timeout)
    assert until()


# --- runworker ------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_runworker_with_signing_keys_runs_only_jobs_signed_with_a_listed_key(redis, redis_url, tmp_path):
    keys = QueueKeys.for_queue(QUEUE)
    log = tmp_path / "runworker.log"
    env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "tests.supervisor.settings",
           "PYTHONPATH": str(ROOT), "CHASQUI_SIGNING_KEYS": f"{CURRENT}, {OLDER}"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "runworker", QUEUE, "--poll-interval", "0.05"],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        Queue(QUEUE, redis_client=redis, signing_key=CURRENT).add(NAP, ["current", 0])
        Queue(QUEUE, redis_client=redis, signing_key=OLDER).add(NAP, ["older", 0])
        unsigned = Queue(QUEUE, redis_client=redis).add(NAP, ["unsigned", 0])
        keyed = Queue(QUEUE, redis_client=redis, signing_key=CURRENT)
        keyed.add(NAP, ["keyed", 0], idempotency_key="nap-once")
        wait_for(lambda: redis.exists(keys.done + "nap-once") and redis.xlen(keys.dlq) == 1, 120,
                 "the signed jobs to run and the unsigned one to be refused")
        keyed.add(NAP, ["keyed again", 0], idempotency_key="nap-once")
        wait_for(lambda: totals.read_totals(redis, [QUEUE])[QUEUE].counters["skipped"] == 1, 30, "the duplicate")
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    started = sorted(entry.decode().split(":")[0] for entry in redis.lrange(STARTED, 0, -1))
    assert started == ["current", "keyed", "older"]
    [(_, dead)] = redis.xrange(keys.dlq)
    assert dead[b"reason"] == b"bad_signature" and dead[b"job_id"].decode() == unsigned.job_id
    output = log.read_text()
    assert "signed jobs only (2 key(s))" in output, output
