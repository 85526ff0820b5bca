"""A run that returned is never charged a death, though its process dies before its outcome is settled.

Found by the accounting soak on a busy host: jobs that had returned in a
worker process killed 0-70 ms later were charged a death (their start-journal
mark was struck once per turn of the event loop, after the outcome reached
the loop), and two such deaths dead-lettered a job that did nothing wrong as
``panic``. Here the event loop is held by an async job that blocks it, so the
sync run's outcome cannot reach the loop before a neighbour kills the
process: the run's thread must strike its mark itself, the moment the handler
returns. The job then runs again (at least once), uncharged.
"""

import time

import pytest

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.producer.queue import Queue
from tests.engine.worker_app import dead_envelope, dlq_entries, read_runs, runs_by_job, settled


@pytest.mark.timeout(90)
def test_a_sync_run_that_returned_before_its_process_died_is_not_charged(redis, workers):
    queue = "c-returned"
    q = Queue(queue, redis_client=redis)
    returned = q.add("noop")
    killer = q.add("die_after", kwargs={"job_id": returned.job_id, "pause": 0.3})
    hog = q.add("hog", kwargs={"seconds": 3.0})  # async: started last, holds the loop while the others run
    first = workers.start(queue, visibility_ms=1000, concurrency=4, flush_interval=2.0)
    first.wait(30)
    assert first.returncode == 1, "the killer job ended the first worker"
    workers.bury(redis, first, queue)  # as its supervisor would: the runs under way are deaths
    workers.start(queue, visibility_ms=1000, concurrency=4)
    deadline = time.monotonic() + 45
    while not settled(redis, queue) or len(runs_by_job(read_runs(redis)).get(returned.job_id, [])) < 2:
        assert time.monotonic() < deadline, f"the queue never settled:\n{workers.logs()}"
        time.sleep(0.05)
    runs = runs_by_job(read_runs(redis))
    assert [r.attempt for r in runs[returned.job_id]] == [1, 1], (
        "the run that returned was charged a death: its second run is not attempt 1 "
        f"({[(r.attempt, r.pid) for r in runs[returned.job_id]]})")
    assert runs[killer.job_id][-1].attempt == 2, "the job that was running when the process died is charged"
    assert len(runs[hog.job_id]) == 2
    assert dlq_entries(redis, queue) == [], [decode(e["j"]).errors for e in dlq_entries(redis, queue)]


@pytest.mark.timeout(120)
def test_a_sync_run_given_up_at_its_timeout_is_not_charged_when_its_process_dies_before_the_settle(redis, workers):
    """A sync run past its timeout is given up: its outcome (a JobTimeout) is written at once, though its thread
    never returns to strike its journal mark. The soak met a process that died right after, before the settle:
    the run was charged a death and its job dead-lettered as WorkerLost. The mark is struck where the run is
    given up now, so the lost outcome only makes the job run again."""
    queue = "c-given-up"
    q = Queue(queue, redis_client=redis)
    stuck = q.add("block", kwargs={"seconds": 30})
    q.add("die_after", kwargs={"job_id": stuck.job_id, "pause": 2.0})  # after the timeout, before the settle
    first = workers.start(queue, visibility_ms=1000, concurrency=4, flush_interval=5.0, job_timeout=1.0,
                          max_attempts=2)
    first.wait(30)
    assert first.returncode == 1, "the killer job ended the first worker"
    workers.bury(redis, first, queue)  # its death on record, as its supervisor would write it
    workers.start(queue, visibility_ms=1000, concurrency=4, job_timeout=1.0, max_attempts=2)
    deadline = time.monotonic() + 60
    while not dlq_entries(redis, queue):
        assert time.monotonic() < deadline, f"the stuck job never reached the DLQ:\n{workers.logs()}"
        time.sleep(0.1)
    [entry] = [e for e in dlq_entries(redis, queue) if decode(e["j"]).id == stuck.job_id]
    history = [e.get("class") for e in dead_envelope(entry).errors]
    assert "WorkerLost" not in history, f"the run given up at its timeout was charged a death: {history}"
    assert entry["reason"] == b"retries_exhausted" and history[-1].endswith("JobTimeout")
