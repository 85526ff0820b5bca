"""task.enqueue_many / aenqueue_many: many jobs, one round trip per chunk, all or nothing on bad input."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import PayloadTooLarge
from chasqui_core.models import OutboxEntry
from tests.helpers import info_per_server

from . import sample_tasks

DEFAULT = QueueKeys.for_queue("default")
BACKEND = "chasqui_core.backend.ChasquiBackend"


pytestmark = pytest.mark.usefixtures("fresh_backend")


def _stream_jobs(redis):
    return [decode(fields[b"j"]) for _, fields in redis.xrange(DEFAULT.stream)]


def _script_calls(redis) -> int:
    """Script calls the server (every master of a cluster) has run."""
    return sum(stats.get(name, {}).get("calls", 0) for stats in info_per_server(redis, "commandstats")
               for name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))


def test_results_come_back_in_order_and_match_the_stream(redis):
    results = sample_tasks.add.enqueue_many([([i, 1], {}) for i in range(2500)])
    assert [r.status for r in results] == [TaskResultStatus.READY] * 2500
    assert all(r.enqueued_at is not None for r in results)
    jobs = _stream_jobs(redis)
    assert [j.id for j in jobs] == [r.id for r in results]
    assert [j.args for j in jobs] == [[i, 1] for i in range(2500)]
    assert [r.args for r in results[:3]] == [[0, 1], [1, 1], [2, 1]]


def test_one_round_trip_per_chunk(redis):
    queue = task_backends["default"].queue("default")
    sample_tasks.add.enqueue_many([([0, 0], {})] * 2)  # registers the queue and loads the script
    before = _script_calls(redis)
    sample_tasks.add.enqueue_many([([i, i], {}) for i in range(queue.chunk_size * 2 + 1)])
    assert _script_calls(redis) - before == 3


def test_kwargs_and_using_options_ride_every_job(redis):
    results = sample_tasks.flaky.using(attempts=7, backoff=50).enqueue_many(
        [(["a"], {"fail_times": 0}), (["b"], {"fail_times": 1})])
    jobs = _stream_jobs(redis)
    assert [(j.args, j.kwargs, j.max_attempts) for j in jobs] == [
        (["a"], {"fail_times": 0}, 7), (["b"], {"fail_times": 1}, 7)]
    assert all(j.backoff["initial_ms"] == 50 for j in jobs)
    assert [r.kwargs for r in results] == [{"fail_times": 0}, {"fail_times": 1}]


def test_run_after_sends_every_job_to_the_delayed_set(redis):
    when = timezone.now() + timedelta(hours=1)
    results = sample_tasks.add.using(run_after=when).enqueue_many([([1, 2], {}), ([3, 4], {})])
    assert redis.xlen(DEFAULT.stream) == 0
    assert sorted(decode(m).id for m in redis.zrange(DEFAULT.delayed, 0, -1)) == sorted(r.id for r in results)


@pytest.mark.parametrize("calls, message", [
    ([([1, 2], {}), ([{1, 2}, 3], {})], "call 1: .*set"),
    ([([1, 2], {}), ([1, 2], {}), ([1], {"b": object()})], "call 2: .*object"),
    ([([1, 2], {}), "not a pair"], "call 1: expected an \\(args, kwargs\\) pair"),
    ([([1, 2], {}), ([1, 2], [])], "call 1: kwargs must be a dict"),
])
def test_a_bad_call_names_its_index_and_nothing_is_sent(redis, calls, message):
    with pytest.raises(TypeError, match=message):
        sample_tasks.add.enqueue_many(calls)
    assert redis.xlen(DEFAULT.stream) == 0


def test_an_oversize_call_names_its_index_and_nothing_is_sent(redis, settings):
    settings.CHASQUI = {"MAX_PAYLOAD_BYTES": 2000}
    with pytest.raises(PayloadTooLarge, match="call 3: .*bytes"):
        sample_tasks.add.enqueue_many([([i, i], {}) for i in range(3)] + [(["x" * 5000, 1], {})])
    assert redis.xlen(DEFAULT.stream) == 0


def test_a_job_id_cannot_name_many_jobs(redis):
    with pytest.raises(ValueError, match="job_id names one job"):
        sample_tasks.add.using(job_id="one").enqueue_many([([1, 1], {}), ([2, 2], {})])
    assert redis.xlen(DEFAULT.stream) == 0
    [result] = sample_tasks.add.using(job_id="one").enqueue_many([([1, 1], {})])
    assert result.id == "one"


def test_no_calls_enqueue_nothing(redis):
    assert sample_tasks.add.enqueue_many([]) == []
    assert redis.xlen(DEFAULT.stream) == 0


def test_aenqueue_many(redis):
    async def go():
        return await sample_tasks.add.aenqueue_many([([i, 0], {}) for i in range(5)])

    results = asyncio.run(go())
    assert [j.id for j in _stream_jobs(redis)] == [r.id for r in results]
    with pytest.raises(TypeError, match="call 1"):
        asyncio.run(sample_tasks.add.aenqueue_many([([1, 1], {}), ([b"bytes", 1], {})]))
    assert redis.xlen(DEFAULT.stream) == 5


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_transaction_enqueue_on_commit_holds_the_batch_until_commit(redis, settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"ENQUEUE_ON_COMMIT": True}}}
    with transaction.atomic():
        results = sample_tasks.add.enqueue_many([([i, i], {}) for i in range(3)])
        assert redis.xlen(DEFAULT.stream) == 0
    assert [j.id for j in _stream_jobs(redis)] == [r.id for r in results]
    with pytest.raises(RuntimeError), transaction.atomic():
        sample_tasks.add.enqueue_many([([9, 9], {})] * 2)
        raise RuntimeError("roll back")
    assert redis.xlen(DEFAULT.stream) == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_transaction_outbox_stages_the_batch_and_relays_it_after_commit(redis, settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "emails"], "OPTIONS": {"OUTBOX": True}}}
    with transaction.atomic():
        results = sample_tasks.add.enqueue_many([([i, i], {}) for i in range(600)])
        assert OutboxEntry.objects.count() == 600
        assert redis.xlen(DEFAULT.stream) == 0
    assert OutboxEntry.objects.count() == 0
    assert [j.id for j in _stream_jobs(redis)] == [r.id for r in results]
    with pytest.raises(RuntimeError), transaction.atomic():
        sample_tasks.add.enqueue_many([([9, 9], {})] * 2)
        raise RuntimeError("roll back")
    assert OutboxEntry.objects.count() == 0 and redis.xlen(DEFAULT.stream) == 600


def test_ready_results_are_stored_for_get_result(redis, settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "emails"], "OPTIONS": {"RESULT_TTL": 60}}}
    results = sample_tasks.add.enqueue_many([([1, 2], {}), ([3, 4], {})])
    for result in results:
        stored = sample_tasks.add.get_result(result.id)
        assert stored.status == TaskResultStatus.READY and stored.args == result.args
