"""Crash recovery end to end: workers killed with SIGKILL (or dying by themselves) mid-job.

Nothing may be lost: a dead worker's jobs run again elsewhere once their lease
lapses; a live worker's long job is never taken over; the promoter's lock
passes on when its holder dies; a job that keeps killing its workers ends in
the dead-letter queue instead of killing them forever.
"""

import os
import signal
import time

import pytest

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from tests.engine.worker_app import (
    DONE_SUFFIX,
    RUNS_KEY,
    dlq_entries,
    read_histories,
    read_runs,
    settled,
    wait_for,
)


def kill(proc) -> None:
    """SIGKILL a worker process; returns once it is gone."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.mark.timeout(90)
def test_job_of_a_killed_worker_reruns_on_another_worker(redis, workers):
    visibility_s = 2.0
    procs = [workers.start("c-kill", visibility_ms=int(visibility_s * 1000)) for _ in range(2)]
    workers.wait_ready(redis, "c-kill", 2)
    job = Queue("c-kill", redis_client=redis).add("block", kwargs={"seconds": 3})

    [first] = wait_for(lambda: read_runs(redis), 20, "the job to start")
    [victim] = [p for p in procs if p.pid == first.pid]
    [survivor] = [p for p in procs if p is not victim]
    kill(victim)

    wait_for(lambda: len(read_runs(redis)) >= 2, visibility_s + 15, "the job to run again")
    rerun = read_runs(redis)[1]
    assert rerun.job_id == job.job_id
    assert rerun.pid == survivor.pid
    assert rerun.attempt == 2, "the run lost with the dead worker counts"
    assert rerun.at_ms - first.at_ms >= visibility_s * 1000, "taken over only once the visibility timeout passed"

    wait_for(lambda: redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1) == [job.job_id.encode()], 20, "the rerun to finish")
    wait_for(lambda: settled(redis, "c-kill"), 10, "the queue to settle")
    assert len(read_runs(redis)) == 2
    assert dlq_entries(redis, "c-kill") == []
    assert survivor.poll() is None


@pytest.mark.timeout(90)
def test_a_long_job_keeps_its_lease_and_runs_once(redis, workers):
    # The job runs four times longer than the visibility timeout, beside a
    # second worker that reclaims whatever idles past it.
    for _ in range(2):
        workers.start("c-lease", visibility_ms=1500)
    workers.wait_ready(redis, "c-lease", 2)
    job = Queue("c-lease", redis_client=redis).add("block", kwargs={"seconds": 6})

    wait_for(lambda: redis.llen(RUNS_KEY + DONE_SUFFIX) >= 1, 30, "the long job to finish")
    wait_for(lambda: settled(redis, "c-lease"), 10, "the queue to settle")
    time.sleep(0.5)
    runs = read_runs(redis)
    assert [(r.job_id, r.attempt) for r in runs] == [(job.job_id, 1)], "run once, never taken over"
    assert dlq_entries(redis, "c-lease") == []


@pytest.mark.timeout(90)
def test_promoter_lock_passes_on_when_its_holder_is_killed(redis, workers):
    ttl_s = 1.5
    procs = [workers.start("c-leader", lock_ttl_ms=int(ttl_s * 1000)) for _ in range(2)]
    workers.wait_ready(redis, "c-leader", 2)
    keys = QueueKeys.for_queue("c-leader")
    holder = wait_for(lambda: redis.get(keys.promoter_lock), 20, "a promoter to take the lock").decode()
    leader_pid = int(holder.rsplit(":", 2)[1])
    [leader] = [p for p in procs if p.pid == leader_pid]
    [survivor] = [p for p in procs if p is not leader]
    kill(leader)

    q = Queue("c-leader", redis_client=redis)
    jobs = [q.add("noop", delay=100) for _ in range(5)]
    assert all(j.delayed for j in jobs)
    wait_for(lambda: len(read_runs(redis)) >= 5, ttl_s + 15, "the delayed jobs to be promoted and run")
    runs = read_runs(redis)
    assert sorted(r.job_id for r in runs) == sorted(j.job_id for j in jobs)
    assert {r.pid for r in runs} == {survivor.pid}
    new_holder = redis.get(keys.promoter_lock).decode()
    assert int(new_holder.rsplit(":", 2)[1]) == survivor.pid


@pytest.mark.timeout(90)
def test_job_that_kills_its_worker_twice_is_dead_lettered_as_panic(redis, workers):
    q = Queue("c-panic", redis_client=redis)
    job = q.add("die")
    started = []
    deadline = time.monotonic() + 60
    while redis.xlen(q.keys.dlq) == 0:
        assert time.monotonic() < deadline, "the job never reached the dead-letter queue"
        if not started or started[-1].poll() is not None:
            if started:  # its supervisor would record the death: see Workers.bury
                workers.bury(redis, started[-1], "c-panic")
            assert len(started) < 3, f"the job killed {len(started)} workers"
            started.append(workers.start("c-panic", visibility_ms=1000))
        time.sleep(0.05)
    assert [p.returncode for p in started[:-1]] == [1, 1], "it killed two workers"

    wait_for(lambda: settled(redis, "c-panic"), 10, "the queue to settle")
    runs = read_runs(redis)
    assert [(r.job_id, r.attempt) for r in runs] == [(job.job_id, 1), (job.job_id, 2)]
    [entry] = dlq_entries(redis, "c-panic")
    assert entry["reason"] == b"panic"
    assert entry["job_id"].decode() == job.job_id
    assert entry["error_class"] == b"WorkerLost"
    dead = decode(entry["j"])
    assert dead.id == job.job_id and (dead.attempt, dead.deaths) == (2, 2)
    assert [(e["attempt"], e["class"]) for e in dead.errors] == [(1, "WorkerLost"), (2, "WorkerLost")]
    assert started[-1].poll() is None, "the third worker never ran it"


@pytest.mark.timeout(90)
def test_a_worker_cut_off_past_its_visibility_timeout_is_lost_contact_not_a_death(redis, workers):
    """A process that stops answering (SIGSTOP: a partition, a blocked loop) but lives is not dead.

    Its job runs again elsewhere (at least once), charged a run with a
    ``LostContact`` line and no death; when it comes back, its own outcome for
    the entry is dropped: nothing dead-lettered, nothing settled twice, the
    rerun's entry untouched.
    """
    cut = workers.start("c-contact", visibility_ms=1000, block_ms=100, poll=0.02)
    workers.wait_ready(redis, "c-contact", 1)
    job = Queue("c-contact", redis_client=redis).add("noted", kwargs={"seconds": 1.5})
    [first] = wait_for(lambda: read_runs(redis), 20, "the job to start")
    os.kill(cut.pid, signal.SIGSTOP)
    try:
        survivor = workers.start("c-contact", visibility_ms=1000, block_ms=100, poll=0.02)
        wait_for(lambda: len(read_runs(redis)) >= 2, 30, "the job to run again")
        wait_for(lambda: len(redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)) == 1, 20, "the rerun to finish")
    finally:
        os.kill(cut.pid, signal.SIGCONT)
    wait_for(lambda: len(redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)) == 2, 20, "the cut-off run to finish too")
    keys = QueueKeys.for_queue("c-contact")
    wait_for(lambda: settled(redis, "c-contact"), 10, "the queue to settle")
    time.sleep(1.0)  # the cut-off worker's late outcome and lease pass
    runs = read_runs(redis)
    assert [(r.job_id, r.attempt, r.pid) for r in runs] == [
        (job.job_id, 1, cut.pid), (job.job_id, 2, survivor.pid)]
    assert dlq_entries(redis, "c-contact") == []
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.totals).items()}
    assert (totals.get("lost_contact"), totals.get("lost", 0), totals["completed"]) == (1, 0, 1), totals
    assert redis.xlen(keys.stream) == 0 and redis.zcard(keys.delayed) == 0
    assert cut.poll() is None and survivor.poll() is None
    first_seen, rerun_seen = read_histories(redis)
    assert (first_seen.deaths, first_seen.errors) == (0, [])
    assert rerun_seen.deaths == 0, "lost contact was charged as a death"
    [(cls, worker)] = rerun_seen.errors
    assert cls == "LostContact" and worker.split(":")[1] == str(cut.pid)



@pytest.mark.timeout(90)
def test_a_run_lost_in_a_process_that_crashed_while_it_stopped_is_charged_a_death(redis, workers):
    """A stopping worker puts its end on record before its last runs finish (a supervisor that is gone can no
    longer do it for its children, which stop by themselves): a run of it lost in a crash while it winds down is
    charged as a death, not as lost contact."""
    queue = "c-stopping"
    q = Queue(queue, redis_client=redis)
    job = q.add("die_on_signal", kwargs={"key": "c-stopping:now"})
    proc = workers.start(queue, visibility_ms=1000, concurrency=2, shutdown_timeout=20)
    wait_for(lambda: read_runs(redis), 20, "the job to start")
    proc.send_signal(signal.SIGTERM)  # a graceful stop: it waits for the run
    keys = QueueKeys.for_queue(queue)
    [worker_id] = [w.decode() for w in redis.hkeys(keys.workers) if w.decode().split(":")[1] == str(proc.pid)]
    wait_for(lambda: redis.exists(keys.died(worker_id)), 10, "the stopping worker's end on record")
    redis.set("c-stopping:now", 1)  # the run now kills the process while it winds down
    proc.wait(20)
    workers.start(queue, visibility_ms=1000, concurrency=2)
    wait_for(lambda: len(read_runs(redis)) == 2 and settled(redis, queue), 30, "the job to run again")
    second = read_runs(redis)[1]
    assert second.job_id == job.job_id and second.attempt == 2
    totals = {k.decode(): int(v) for k, v in redis.hgetall(QueueKeys.for_queue(queue).metrics + "total").items()}
    assert totals.get("lost") == 1 and not totals.get("lost_contact"), totals
