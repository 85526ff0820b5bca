"""Cancelling jobs by id, end to end: waiting, delayed and running jobs, with real worker processes.

Each cancelled job must end in the dead-letter queue with reason ``cancelled`` and a
``JobCancelled`` error, and a waiting or delayed one must never have run (the handlers record
every start). Bounds on how soon are generous: timing goals belong to the benchmarks.
"""

import pytest

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.settle.outcomes import CANCELLED_CLASS
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.results import decode_result
from tests.engine.worker_app import DONE_SUFFIX, RUNS_KEY, dlq_entries, read_runs, settled, wait_for


def ran(client, job_id):
    return [r for r in read_runs(client) if r.job_id == job_id]


def cancelled_entry(client, queue, job_id):
    for entry in dlq_entries(client, queue):
        if entry["job_id"].decode() == job_id:
            return entry
    return None


def test_a_waiting_job_that_is_cancelled_never_runs(redis, workers):
    q = Queue("c-wait", redis_client=redis)
    doomed = q.add("noop", result_ttl=60)
    kept = q.add("noop")
    request = q.cancel(doomed.job_id)
    assert not request.moved_from_delayed
    assert redis.hexists(QueueKeys.for_queue("c-wait").cancel, doomed.job_id)

    workers.start("c-wait")
    wait_for(lambda: ran(redis, kept.job_id), 20, "the other job to run")
    entry = wait_for(lambda: cancelled_entry(redis, "c-wait", doomed.job_id), 10, "the cancelled job in the DLQ")
    assert entry["reason"] == b"cancelled"
    assert entry["error_class"].decode() == CANCELLED_CLASS
    assert ran(redis, doomed.job_id) == []
    result = decode_result(redis.get(QueueKeys.for_queue("c-wait").result + doomed.job_id))
    assert result["status"] == "FAILED"
    assert result["errors"][-1]["class"] == CANCELLED_CLASS
    # once settled, the request is struck, so a replay of the job would run it
    wait_for(lambda: not redis.exists(QueueKeys.for_queue("c-wait").cancel), 10, "the request to be struck")
    wait_for(lambda: settled(redis, "c-wait"), 10, "the queue to settle")


def test_a_delayed_job_that_is_cancelled_leaves_the_delayed_set_and_never_runs(redis, workers):
    workers.start("c-delay")
    workers.wait_ready(redis, "c-delay", 1)
    q = Queue("c-delay", redis_client=redis)
    job = q.add("noop", delay=60_000)
    assert redis.zcard(QueueKeys.for_queue("c-delay").delayed) == 1

    assert q.cancel(job.job_id).moved_from_delayed
    entry = wait_for(lambda: cancelled_entry(redis, "c-delay", job.job_id), 10, "the cancelled job in the DLQ")
    assert entry["reason"] == b"cancelled"
    assert redis.zcard(QueueKeys.for_queue("c-delay").delayed) == 0
    assert ran(redis, job.job_id) == []


def test_a_running_async_job_is_cancelled_well_before_it_would_end(redis, workers):
    workers.start("c-async")
    q = Queue("c-async", redis_client=redis)
    job = q.add("slow", kwargs={"seconds": 60})
    other = q.add("slow", kwargs={"seconds": 0.2})
    wait_for(lambda: ran(redis, job.job_id), 20, "the job to start")

    q.cancel(job.job_id)
    entry = wait_for(lambda: cancelled_entry(redis, "c-async", job.job_id), 15, "the running job to be cancelled")
    assert entry["reason"] == b"cancelled"
    assert b"while it ran" in entry["error"]
    assert job.job_id.encode() not in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)
    wait_for(lambda: other.job_id.encode() in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1), 10, "the other job")
    wait_for(lambda: settled(redis, "c-async"), 10, "the queue to settle")


def test_a_running_sync_job_is_told_and_stops_when_it_checks(redis, workers):
    workers.start("c-sync")
    q = Queue("c-sync", redis_client=redis)
    job = q.add("obedient", kwargs={"seconds": 60})
    wait_for(lambda: ran(redis, job.job_id), 20, "the job to start")

    q.cancel(job.job_id)
    entry = wait_for(lambda: cancelled_entry(redis, "c-sync", job.job_id), 15, "the sync job to stop")
    assert entry["reason"] == b"cancelled"
    assert redis.lrange(RUNS_KEY + ":told", 0, -1) == [job.job_id.encode()]
    assert ran(redis, job.job_id)[0].attempt == 1 and len(ran(redis, job.job_id)) == 1


@pytest.mark.timeout(60)
def test_a_sync_job_that_ignores_the_cancel_is_given_up_after_the_grace(redis, workers):
    workers.start("c-stubborn", cancel_grace=1, concurrency=1)
    q = Queue("c-stubborn", redis_client=redis)
    job = q.add("block", kwargs={"seconds": 40})
    wait_for(lambda: ran(redis, job.job_id), 20, "the job to start")

    q.cancel(job.job_id)
    entry = wait_for(lambda: cancelled_entry(redis, "c-stubborn", job.job_id), 15, "the job to be given up")
    assert entry["reason"] == b"cancelled"
    # its thread is abandoned and another takes its place: the queue goes on
    after = q.add("noop")
    wait_for(lambda: ran(redis, after.job_id), 15, "a job after the abandoned one")
    assert job.job_id.encode() not in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)


def test_cancelling_twice_or_an_unknown_id_is_harmless(redis, workers):
    q = Queue("c-twice", redis_client=redis)
    job = q.add("noop")
    q.cancel(job.job_id)
    q.cancel(job.job_id)
    q.cancel("no-such-job")
    workers.start("c-twice")
    wait_for(lambda: cancelled_entry(redis, "c-twice", job.job_id), 20, "the cancelled job in the DLQ")
    assert len(dlq_entries(redis, "c-twice")) == 1
    assert ran(redis, job.job_id) == []
    with pytest.raises(ValueError):
        q.cancel("")


def test_a_job_fetched_by_a_worker_but_not_started_is_taken_out_of_its_inbox(redis, workers):
    """Concurrency 1: the second job of the batch waits in the worker while the first runs."""
    q = Queue("c-inbox", redis_client=redis)
    first = q.add("slow", kwargs={"seconds": 4})
    second = q.add("slow", kwargs={"seconds": 0.1})  # async too: sync jobs have threads of their own
    workers.start("c-inbox", concurrency=1)
    wait_for(lambda: ran(redis, first.job_id), 20, "the first job to start")
    q.cancel(second.job_id)
    entry = wait_for(lambda: cancelled_entry(redis, "c-inbox", second.job_id), 10, "the waiting job cancelled")
    assert b"before it started" in entry["error"]
    assert first.job_id.encode() not in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1), "cancelled while the first ran"
    wait_for(lambda: first.job_id.encode() in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1), 20, "the first job")
    assert ran(redis, second.job_id) == []


def test_a_cancelled_job_replayed_from_the_dlq_runs_on_the_same_worker(redis, workers):
    """The worker checks batches against its copy of the cancel record; striking a settled request bumps the
    record's version, so the copy is read again and the replay is not refused as still cancelled."""
    from chasqui_core.engine.dlq.replay import DeadLetters

    workers.start("c-replay")
    workers.wait_ready(redis, "c-replay", 1)
    q = Queue("c-replay", redis_client=redis)
    job = q.add("noop", delay=60_000)
    q.cancel(job.job_id)
    wait_for(lambda: cancelled_entry(redis, "c-replay", job.job_id), 10, "the cancelled job in the DLQ")
    wait_for(lambda: not redis.hexists(QueueKeys.for_queue("c-replay").cancel, job.job_id), 10, "the request struck")
    dead = DeadLetters(redis, "c-replay")
    assert dead.replay([dead.page().items[0].entry_id]) == 1
    wait_for(lambda: ran(redis, job.job_id), 15, "the replayed job to run")
    assert len(dlq_entries(redis, "c-replay")) == 0
