"""Jobs fetched beside a poison pill run; only the pill is dead-lettered as ``panic``.

Found by the accounting soak (``python -m bench soak``) on the engine that
counted deliveries rather than runs: a worker fetches a batch whose first
job kills the process (``os._exit``) before the others start; a live worker
reclaimed the whole batch, counting a delivery for every entry, and the
pill killed it too; at the next reclaim every entry of the batch had been
"delivered" three times and was dead-lettered as ``panic`` ("the job was
running when its worker died 2 times"), although only the pill ever ran.

docs/retries.md promises ``panic`` for a job that was *running* at two
worker deaths; the start journal (engine/recovery/journal.py) now charges only the
runs that had started. This test keeps it that way.
"""

import time

import pytest

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.producer.queue import Queue
from tests.engine.worker_app import DONE_SUFFIX, RUNS_KEY, dlq_entries, read_runs, settled, wait_for


@pytest.mark.timeout(90)
def test_jobs_fetched_beside_a_poison_pill_run_instead_of_dying_with_it(redis, workers):
    q = Queue("c-bystanders", redis_client=redis)
    pill = q.add("die")
    bystanders = [q.add("noop") for _ in range(3)]
    started = []
    deadline = time.monotonic() + 60
    while redis.xlen(q.keys.dlq) == 0 or not settled(redis, "c-bystanders"):
        assert time.monotonic() < deadline, "the queue never settled"
        if not started or started[-1].poll() is not None:
            if started:  # its supervisor would record the death: see Workers.bury
                workers.bury(redis, started[-1], "c-bystanders")
            assert len(started) < 4, f"the pill killed {len(started)} workers"
            # one sync thread: the pill, first in the batch, runs before any bystander can start
            started.append(workers.start("c-bystanders", visibility_ms=1000, concurrency=1))
        time.sleep(0.05)
    assert [p.returncode for p in started[:-1]] == [1, 1], "the pill killed two workers"

    wait_for(lambda: settled(redis, "c-bystanders"), 10, "the queue to settle")
    dead = {decode(e["j"]).id: e["reason"] for e in dlq_entries(redis, "c-bystanders")}
    ran = {r.job_id for r in read_runs(redis)}
    assert dead == {pill.job_id: b"panic"}, (
        f"only the pill may be a poison pill; dead-lettered: {dead}; bystanders that ever ran: "
        f"{sorted(ran & {b.job_id for b in bystanders})}")
    assert {b.job_id for b in bystanders} <= ran


@pytest.mark.timeout(120)
def test_a_pill_among_running_neighbours_in_two_processes_dead_letters_only_itself(redis, workers):
    """The neighbours running beside the pill die with it once and are charged, rightly: they were running. Run
    beside it again, they would die a second time and be dead-lettered as ``panic`` (at ``--concurrency 4``
    the soak saw 2 of 50 neighbours go; at 8, 18 of 60). A job charged a lost run now runs alone in its
    process, so the pill's second death is its own and the neighbours finish."""
    queue = "c-bystanders-4"
    q = Queue(queue, redis_client=redis)
    neighbours = [q.add("block", kwargs={"seconds": 0.3}) for _ in range(3)]  # start beside the pill
    pill = q.add("die")
    neighbours += [q.add("block", kwargs={"seconds": 0.1}) for _ in range(20)]
    procs = [workers.start(queue, visibility_ms=1000, concurrency=4, batch_size=8) for _ in range(2)]
    deaths = 0
    deadline = time.monotonic() + 90
    while redis.xlen(q.keys.dlq) == 0 or not settled(redis, queue):
        assert time.monotonic() < deadline, f"the queue never settled:\n{workers.logs()}"
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                workers.bury(redis, proc, queue)  # its supervisor would record the death
                deaths += 1
                assert deaths <= 4, f"the pill killed {deaths} workers"
                procs[i] = workers.start(queue, visibility_ms=1000, concurrency=4, batch_size=8)
        time.sleep(0.05)
    wait_for(lambda: settled(redis, queue), 10, "the queue to settle")
    dead = {decode(e["j"]).id: e["reason"] for e in dlq_entries(redis, queue)}
    assert dead == {pill.job_id: b"panic"}, f"only the pill may be dead-lettered; dead-lettered: {dead}"
    finished = {job_id.decode() for job_id in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)}
    assert {n.job_id for n in neighbours} <= finished, "every neighbour ran to its end"
    assert deaths == 2, "the pill killed two workers: once among its neighbours, once alone"


@pytest.mark.timeout(120)
def test_an_async_pill_that_kills_before_its_first_await_takes_no_neighbour_along(redis, workers):
    """An async job that kills its process before its first ``await`` is never marked running (the mark goes out
    after the round of starts). The jobs fetched with it used to be counted toward the poison-pill limit at every
    death, as if each might have been the killer: read again beside it, crash after crash, they reached the limit
    with it and were dead-lettered as ``panic`` without having run. Now only the jobs of the round the process died
    in are counted, and those run alone next, where the pill's deaths are its own."""
    queue = "c-async-pill"
    q = Queue(queue, redis_client=redis)
    neighbours = [q.add("quick") for _ in range(30)]
    pill = q.add("die_at_once")
    neighbours += [q.add("quick") for _ in range(30)]
    options = {"visibility_ms": 1000, "concurrency": 8, "batch_size": 16}
    procs = [workers.start(queue, **options) for _ in range(2)]
    deaths = 0
    deadline = time.monotonic() + 100
    while redis.xlen(q.keys.dlq) == 0 or not settled(redis, queue):
        assert time.monotonic() < deadline, f"the queue never settled:\n{workers.logs()}"
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                workers.bury(redis, proc, queue)  # its supervisor would record the death
                deaths += 1
                assert deaths <= 5, f"the pill killed {deaths} workers"
                procs[i] = workers.start(queue, **options)
        time.sleep(0.05)
    wait_for(lambda: settled(redis, queue), 10, "the queue to settle")
    dead = {decode(e["j"]).id: e["reason"] for e in dlq_entries(redis, queue)}
    assert dead == {pill.job_id: b"panic"}, f"only the pill may be dead-lettered; dead-lettered: {dead}"
    finished = {job_id.decode() for job_id in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1)}
    assert {n.job_id for n in neighbours} <= finished, "every neighbour ran to its end"
    assert deaths == 3, "the pill killed three workers: once in its round of starts, twice alone"
