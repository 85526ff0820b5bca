"""The transactional outbox: jobs commit with the data, and survive Redis being down at commit."""

from __future__ import annotations

import socket
import time

import pytest
from django.db import transaction
from django.tasks import task_backends

from chasqui_core.engine.envelope import decode
from chasqui_core.engine.keys import QueueKeys
from chasqui_core.engine.queue import JobSpec
from chasqui_core.management.commands.runworker import _outbox_relay
from chasqui_core.models import OutboxEntry
from chasqui_core.outbox import OutboxRelay, relay

from . import sample_tasks

DEFAULT = QueueKeys.for_queue("default")


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
    with pytest.raises(RuntimeError):
        with transaction.atomic():
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
    OutboxEntry.objects.create(queue="default", job_id=built[3], payload=built[2], when="")
    queue.add_encoded([(built[3], "", built[2])])  # sent once already (a relay whose reply was lost)
    assert relay(outbox_on.queue) == 1  # the row is consumed...
    assert redis.xlen(DEFAULT.stream) == 1  # ...but the job is in Redis once


@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_relay_thread_drains_leftovers(outbox_on, redis):
    queue = outbox_on.queue("default")
    for i in range(5):
        built = queue.build(JobSpec("tests.django.sample_tasks.add", [i, i]))
        OutboxEntry.objects.create(queue="default", job_id=built[3], payload=built[2], when="")
    relay_thread = OutboxRelay(outbox_on.queue, interval=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while OutboxEntry.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay_thread.stop()
    assert not OutboxEntry.objects.exists()
    assert redis.xlen(DEFAULT.stream) == 5


@pytest.mark.django_db(transaction=True)
def test_a_worker_relays_the_outbox_through_the_backend_only_when_it_is_on(outbox_on, redis, settings):
    queue = outbox_on.queue("default")
    built = queue.build(JobSpec("tests.django.sample_tasks.add", [2, 2]))
    OutboxEntry.objects.create(queue="default", job_id=built[3], payload=built[2], when="")
    relay_thread = _outbox_relay()
    assert relay_thread is not None
    try:
        deadline = time.monotonic() + 10
        while OutboxEntry.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay_thread.stop()
    assert [decode(f[b"j"]).id for _, f in redis.xrange(DEFAULT.stream)] == [built[3]]

    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default"]}}
    assert _outbox_relay() is None
