"""Operators' commands to a running worker (engine/ops/control.py): quiet and stop, against real worker processes."""

import time

import pytest

from chasqui_core.engine.ops import control, stats
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.ops.running_jobs import running_jobs
from chasqui_core.engine.store.scripts import Scripts
from tests.engine.worker_app import DONE_SUFFIX, RUNS_KEY, read_runs, runs_by_job, settled, wait_for


def _only_worker(redis, queue: str) -> stats.WorkerInfo:
    found = stats.workers(redis, queue)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.timeout(90)
def test_quiet_stops_fetching_and_finishes_what_runs(redis, workers):
    # Prefetch is 100 with concurrency 4: most of the 40 jobs wait in the worker's inbox when the quiet comes.
    proc = workers.start("c-quiet", concurrency=4, batch_size=100, block_ms=3000)
    workers.wait_ready(redis, "c-quiet", 1)
    q = Queue("c-quiet", redis_client=redis)
    ids = {e.job_id for e in q.add_bulk([JobSpec("slow", kwargs={"seconds": 1.0}) for _ in range(40)])}
    wait_for(lambda: redis.llen(RUNS_KEY) >= 4, 20, "4 slow jobs to start")
    worker = _only_worker(redis, "c-quiet")
    # a run is written to the start journal just after it starts (fire-and-forget): wait for the marks to land
    wait_for(lambda: running_jobs(redis, worker.id, ["c-quiet"]).total == 4, 10, "the 4 runs in the journal")
    page = running_jobs(redis, worker.id, ["c-quiet"])
    assert page.total == 4 and {r.job_id for r in page.items} <= ids and all(r.task == "slow" for r in page.items)

    assert control.send(Scripts(redis), worker.id, "quiet")
    assert not control.send(Scripts(redis), worker.id, "quiet"), "a second quiet changes nothing"
    wait_for(lambda: _only_worker(redis, "c-quiet").state == "quiet", 10, "the worker to report quiet")
    keys = QueueKeys.for_queue("c-quiet")
    # what it had fetched and not started is back on the stream, undelivered: 36 waiting, none pending with it
    wait_for(lambda: redis.llen(RUNS_KEY + DONE_SUFFIX) >= 4, 20, "the running jobs to finish")
    wait_for(lambda: redis.xpending(keys.stream, GROUP)["pending"] == 0, 10, "the running jobs to be settled")
    started_before = {r.job_id for r in read_runs(redis)}
    assert len(started_before) >= 4
    more = q.add_bulk([JobSpec("slow", kwargs={"seconds": 0.01}) for _ in range(5)])
    ids |= {e.job_id for e in more}
    time.sleep(2.5)  # several control and read turns: a quiet worker must not fetch any of them
    assert {r.job_id for r in read_runs(redis)} == started_before, "a quiet worker started a job"
    assert redis.xlen(keys.stream) == 40 - len(started_before) + 5
    assert proc.poll() is None, "quiet is not stop"
    waiting = {decode(f[b"j"]).id for _, f in redis.xrange(keys.stream)}
    assert waiting == ids - started_before, "every job is either done or waiting: none lost"
    assert all(decode(f[b"j"]).attempt == 0 for _, f in redis.xrange(keys.stream)), "nothing was charged"

    assert control.send(Scripts(redis), worker.id, "stop")
    assert not control.send(Scripts(redis), worker.id, "quiet"), "a quiet does not replace a stop"
    assert proc.wait(20) == 0, workers.logs()
    assert redis.get(control.control_key(worker.id)) is None, "the worker clears its command when it leaves"
    assert stats.workers(redis, "c-quiet") == []

    workers.start("c-quiet", concurrency=20)
    wait_for(lambda: settled(redis, "c-quiet"), 30, "a new worker to run what was left")
    by_job = runs_by_job(read_runs(redis))
    assert set(by_job) == ids
    assert {job: len(runs) for job, runs in by_job.items() if len(runs) > 1} == {}, "every job ran exactly once"


@pytest.mark.timeout(60)
def test_stop_lets_running_jobs_finish_and_returns_the_rest(redis, workers):
    proc = workers.start("c-stop", concurrency=5, block_ms=3000)
    workers.wait_ready(redis, "c-stop", 1)
    q = Queue("c-stop", redis_client=redis)
    # runs of 3 s: the stop (heard within about a second) comes while the first five run
    ids = {e.job_id for e in q.add_bulk([JobSpec("slow", kwargs={"seconds": 3.0}) for _ in range(15)])}
    wait_for(lambda: redis.llen(RUNS_KEY) >= 5, 20, "5 slow jobs to start")
    worker = _only_worker(redis, "c-stop")
    assert control.send(Scripts(redis), worker.id, "stop")
    wait_for(lambda: _only_worker(redis, "c-stop").state == "stopping", 10, "the worker to report stopping")
    assert proc.wait(20) == 0, workers.logs()
    started = {r.job_id for r in read_runs(redis)}
    assert len(started) == 5, "no job starts once the stop is heard"
    assert sorted(j.decode() for j in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)) == sorted(started)
    keys = QueueKeys.for_queue("c-stop")
    assert redis.xpending(keys.stream, GROUP)["pending"] == 0
    assert {decode(f[b"j"]).id for _, f in redis.xrange(keys.stream)} == ids - started
    assert "stopping, as an operator asked" in workers.logs()


def test_a_command_is_refused_in_words(redis):
    with pytest.raises(ValueError, match="quiet, stop"):
        control.send(Scripts(redis), "w", "pause")  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_quiet_hands_back_sync_jobs_no_thread_has_started(redis, workers):
    proc = workers.start("c-quiet-sync", concurrency=2, block_ms=3000)
    workers.wait_ready(redis, "c-quiet-sync", 1)
    q = Queue("c-quiet-sync", redis_client=redis)
    ids = {e.job_id for e in q.add_bulk([JobSpec("block", kwargs={"seconds": 2.0}) for _ in range(10)])}
    wait_for(lambda: redis.llen(RUNS_KEY) >= 2, 20, "two sync jobs to start")
    worker = _only_worker(redis, "c-quiet-sync")
    assert control.send(Scripts(redis), worker.id, "quiet")
    wait_for(lambda: _only_worker(redis, "c-quiet-sync").state == "quiet", 10, "the worker to report quiet")
    keys = QueueKeys.for_queue("c-quiet-sync")
    wait_for(lambda: redis.xpending(keys.stream, GROUP)["pending"] == 0, 20, "the two runs to be settled")
    started = {r.job_id for r in read_runs(redis)}
    assert len(started) == 2, "a quiet worker's threads start nothing more"
    assert {decode(f[b"j"]).id for _, f in redis.xrange(keys.stream)} == ids - started
    assert control.send(Scripts(redis), worker.id, "stop")
    assert proc.wait(20) == 0, workers.logs()
