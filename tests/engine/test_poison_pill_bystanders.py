"""Jobs fetched beside a poison pill run; only the pill is dead-lettered as ``panic``.

Found by the accounting soak (``python -m bench soak``) on the engine that
counted deliveries rather than runs: a worker fetches a batch whose first
job kills the process (``os._exit``) before the others start; a live worker
reclaimed the whole batch, counting a delivery for every entry, and the
pill killed it too; at the next reclaim every entry of the batch had been
"delivered" three times and was dead-lettered as ``panic`` ("the job was
running when its worker died 2 times"), although only the pill ever ran.

docs/retries.md promises ``panic`` for a job that was *running* at two
worker deaths; the start journal (engine/journal.py) now charges only the
runs that had started. This test keeps it that way.
"""

import time

import pytest

from chasqui_core.engine.envelope import decode
from chasqui_core.engine.queue import Queue
from tests.engine.worker_app import dlq_entries, read_runs, settled, wait_for


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
