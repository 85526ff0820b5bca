"""Workflows inside ``transaction.atomic()``: sent when the transaction commits, never on a rollback.

The same tests run on SQLite and, in CI's second pass, on PostgreSQL (``-m postgres``).
"""

from __future__ import annotations

import socket

import pytest
from django.db import transaction
from django.tasks import task_backends

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.worker import Worker
from chasqui_core.flows import UnknownBatch, batch, chain, get_batch, step
from chasqui_core.models import OutboxEntry
from chasqui_core.outbox import WORKFLOW, relay
from chasqui_core.task_runner import build_registry
from tests.helpers import run_until

from . import flow_tasks
from .flow_tasks import fetch, notify, parse, square, total

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DEFAULT = QueueKeys.for_queue("default")
BACKEND = "chasqui_core.backend.ChasquiBackend"


@pytest.fixture(autouse=True)
def _clean(fresh_backend):
    flow_tasks.RUNS.clear()


def _option(settings, name):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "emails"], "OPTIONS": {name: True}}}
    return task_backends["default"]


def _run(redis_url, until, timeout=30.0):
    worker = Worker(["default"], build_registry(), url=redis_url, install_signal_handlers=False,
                    promoter_poll_interval=0.02, block_ms=50)
    run_until(worker, until, timeout)


def _ran(name):
    return [r for r in flow_tasks.RUNS if r[0] == name]


def _nothing_sent(redis, handle_id):
    assert redis.xlen(DEFAULT.stream) == 0
    with pytest.raises(UnknownBatch):
        get_batch(handle_id)


@pytest.mark.parametrize("option", ["ENQUEUE_ON_COMMIT", "OUTBOX"])
def test_a_batch_in_a_transaction_is_sent_on_commit_and_runs(option, settings, redis, redis_url):
    _option(settings, option)
    with transaction.atomic():
        handle = batch([step(square, i) for i in range(4)], on_success=step(notify, "done")).enqueue()
        _nothing_sent(redis, handle.id)
    assert get_batch(handle.id).total == 4
    assert not OutboxEntry.objects.exists(), "the outbox row was relayed and deleted"
    _run(redis_url, lambda: _ran("notify"))
    assert _ran("notify") == [("notify", "done")]
    assert get_batch(handle.id).results == [0, 1, 4, 9]


@pytest.mark.parametrize("option", ["ENQUEUE_ON_COMMIT", "OUTBOX"])
def test_a_workflow_rolled_back_sends_nothing(option, settings, redis, redis_url):
    _option(settings, option)
    with pytest.raises(RuntimeError), transaction.atomic():
        one = batch([step(square, 2)], on_complete=step(notify, "never")).enqueue()
        two = chain(step(fetch, "x"), step(parse)).enqueue()
        raise RuntimeError("roll back")
    assert not OutboxEntry.objects.exists()
    _nothing_sent(redis, one.id)
    _nothing_sent(redis, two.id)


def test_a_chain_staged_in_the_outbox_is_one_row_then_runs_to_its_end(settings, redis, redis_url):
    _option(settings, "OUTBOX")
    with transaction.atomic():
        handle = chain(batch([step(square, i) for i in range(3)]), step(total)).enqueue()
        [row] = OutboxEntry.objects.all()
        assert (row.job_id, row.when, row.queue) == (handle.id, WORKFLOW, "default")
    _run(redis_url, lambda: _ran("total"))
    assert _ran("total") == [("total", [0, 1, 4])]
    assert get_batch(handle.id).status == "succeeded"


def test_without_an_option_a_workflow_is_sent_at_once_as_a_job_is(redis):
    with transaction.atomic():
        handle = batch([step(square, 1)]).enqueue()
        assert get_batch(handle.id).total == 1
        assert redis.xlen(DEFAULT.stream) == 1


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_a_workflow_staged_while_redis_is_down_is_relayed_later_and_once(settings, redis, redis_url):
    backend = _option(settings, "OUTBOX")
    settings.CHASQUI = {"REDIS_URL": _closed_port_url()}
    with transaction.atomic():
        handle = batch([step(square, i) for i in range(3)], on_success=step(notify, "once")).enqueue()
    [row] = OutboxEntry.objects.all()
    assert row.attempts == 1 and row.last_error, "the commit went through; the workflow waits in its row"
    assert row.job_id == handle.id

    settings.CHASQUI = {"REDIS_URL": redis_url}  # Redis is back: the workers' relay sends it
    assert relay(backend.queue) == 1
    assert redis.xlen(DEFAULT.stream) == 3
    row.pk = None
    row.save(force_insert=True)  # the same row relayed again (a relay whose delete was lost)
    assert relay(backend.queue) == 1
    assert redis.xlen(DEFAULT.stream) == 3, "a start relayed twice adds its jobs once"
    _run(redis_url, lambda: _ran("notify"))
    assert _ran("notify") == [("notify", "once")]
    assert len(_ran("square")) == 3
    assert get_batch(handle.id).status == "succeeded"
