"""The transactional outbox: jobs commit with the data, and survive Redis being down at commit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from django.db import transaction
from django.tasks import task_backends

from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.store.embedded import EmbeddedValkey
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import JobSpec
from chasqui_core.management.commands.runworker import _outbox_relay
from chasqui_core.models import OutboxEntry
from chasqui_core.outbox import OutboxRelay, relay

from tests.helpers import ROOT, subprocess_database_url

from . import sample_tasks

pytestmark = pytest.mark.postgres  # the relay's row locking differs on PostgreSQL (SKIP LOCKED)

DEFAULT = QueueKeys.for_queue("default")
EMAILS = QueueKeys.for_queue("emails")


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"  # nothing listens there once the socket closes


@pytest.fixture
def outbox_on(settings, redis):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"OUTBOX": True}}}
    yield task_backends["default"]


@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_row_commits_with_the_data_then_reaches_redis(outbox_on, redis):
    with transaction.atomic():
        result = sample_tasks.add.enqueue(1, 2)
        assert OutboxEntry.objects.filter(job_id=result.id).exists()
        assert redis.xlen(DEFAULT.stream) == 0
    assert not OutboxEntry.objects.exists()
    [(_, fields)] = redis.xrange(DEFAULT.stream)
    assert decode(fields[b"j"]).id == result.id


@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_rolled_back_leaves_nothing(outbox_on, redis):
    with pytest.raises(RuntimeError), transaction.atomic():
        sample_tasks.add.enqueue(1, 2)
        raise RuntimeError("roll back")
    assert not OutboxEntry.objects.exists()
    assert redis.xlen(DEFAULT.stream) == 0


@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_keeps_jobs_while_redis_is_down(outbox_on, redis, redis_url, settings):
    settings.CHASQUI = {"REDIS_URL": _closed_port_url()}  # the backend reconnects on a settings change
    with transaction.atomic():
        ids = [sample_tasks.add.enqueue(i, i).id for i in range(3)]
    # the commit went through; the jobs wait in the database
    rows = list(OutboxEntry.objects.order_by("id"))
    assert [r.job_id for r in rows] == ids
    assert all(r.attempts == 1 and "Connection" in r.last_error for r in rows)

    settings.CHASQUI = {"REDIS_URL": redis_url}  # Redis is back
    assert relay(outbox_on.queue) == 3
    assert not OutboxEntry.objects.exists()
    assert [decode(f[b"j"]).id for _, f in redis.xrange(DEFAULT.stream)] == ids


@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_relay_is_idempotent(outbox_on, redis):
    queue = outbox_on.queue("default")
    built = queue.build(JobSpec("tests.django.sample_tasks.add", [1, 1]))
    OutboxEntry.objects.create(queue="default", job_id=built.job_id, payload=built.payload, when="")
    queue.add_encoded([(built[3], "", built[2])])  # sent once already (a relay whose reply was lost)
    assert relay(outbox_on.queue) == 1  # the row is consumed...
    assert redis.xlen(DEFAULT.stream) == 1  # ...but the job is in Redis once


@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_relay_thread_drains_leftovers(outbox_on, redis):
    queue = outbox_on.queue("default")
    for i in range(5):
        built = queue.build(JobSpec("tests.django.sample_tasks.add", [i, i]))
        OutboxEntry.objects.create(queue="default", job_id=built.job_id, payload=built.payload, when="")
    relay_thread = OutboxRelay(outbox_on.queue, interval=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while OutboxEntry.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay_thread.stop()
    assert not OutboxEntry.objects.exists()
    assert redis.xlen(DEFAULT.stream) == 5


def _completed(client, keys: QueueKeys) -> int:
    return sum(int(client.hget(key, "completed") or 0) for key in client.scan_iter(keys.metrics + "m:*"))


def _wait(predicate, timeout: float, what: str, worker: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if worker.poll() is not None:
            raise AssertionError(f"the worker exited ({worker.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_runworker_relays_jobs_staged_while_redis_was_down(settings, tmp_path):
    """The outbox's promise rests on the workers: a job staged during an outage must run once Redis is back.

    A real ``manage.py runworker`` watches a Valkey of this test's own, which then goes down. Jobs enqueued
    meanwhile wait in the outbox table; when the server comes back on the same port (with its data), the
    worker's relay sends them and the worker runs them. Nothing else would send them: the on-commit relay
    already failed.
    """
    from emails.models import Signup
    from emails.tasks import send_welcome_email

    server = EmbeddedValkey(tmp_path / "valkey", appendonly=True)
    url = server.start()
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"OUTBOX": True}}}
    settings.CHASQUI = {"REDIS_URL": url, "ENQUEUE_RETRY_SECONDS": 0}
    env = {**os.environ, "REDIS_URL": url, "DATABASE_URL": subprocess_database_url(), "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "tests.django.outbox_settings"}
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "manage.py", "runworker", "emails"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT)
    client = connect(url)
    try:
        _wait(lambda: client.hlen(EMAILS.workers) == 1, 60, "the worker to start", worker)
        server.stop()  # Redis goes down under a running worker

        with transaction.atomic():
            signups = [Signup.objects.create(email=f"user{i}@example.com") for i in range(3)]
            for signup in signups:
                send_welcome_email.enqueue(signup.id)
        staged = list(OutboxEntry.objects.order_by("id"))
        assert len(staged) == 3 and all(row.attempts == 1 for row in staged), "staged, the first relay failed"

        server.start()  # back on the same port, with its data
        _wait(lambda: not OutboxEntry.objects.exists(), 60, "the worker to relay the outbox", worker)
        _wait(lambda: _completed(client, EMAILS) == 3, 60, "the three jobs to run", worker)
        worker.terminate()
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        client.close()
        server.stop()
    output = log.read_text(errors="replace")
    assert worker.returncode == 0, output
    for signup in signups:
        assert f"Sent welcome email to {signup.email}" in output


@pytest.mark.django_db(transaction=True)
def test_a_worker_relays_the_outbox_through_the_backend_only_when_it_is_on(outbox_on, redis, settings):
    queue = outbox_on.queue("default")
    built = queue.build(JobSpec("tests.django.sample_tasks.add", [2, 2]))
    OutboxEntry.objects.create(queue="default", job_id=built.job_id, payload=built.payload, when="")
    relay_thread = _outbox_relay()
    assert relay_thread is not None
    try:
        deadline = time.monotonic() + 10
        while OutboxEntry.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay_thread.stop()
    assert [decode(f[b"j"]).id for _, f in redis.xrange(DEFAULT.stream)] == [built.job_id]

    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default"]}}
    assert _outbox_relay() is None
