"""A worker's death is charged to the jobs that were running in it, and only to them.

Found by the accounting soak (``python -m bench soak``) and reproduced here:
a worker fetches a batch whose first job (sync) kills the process while the
async jobs of the same batch are being started. The start journal announces
a whole round of async jobs before the first of them starts, so jobs that
never started in that worker are charged its death (a ``WorkerLost`` record
naming it), and after a second such death they are dead-lettered as
``panic`` although they ran once or never. The soak also saw the opposite:
a death charged to nobody, so the pill ran again and killed a third worker.

Async jobs are now written to the journal only once they have started, and
a sync job just before its handler runs.
"""

import time

import pytest

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.producer.queue import Queue
from tests.engine.worker_app import dlq_entries, read_runs, settled


@pytest.mark.timeout(90)
def test_a_death_is_charged_only_to_the_jobs_that_were_running(redis, workers):
    q = Queue("c-journal", redis_client=redis)
    pill = q.add("die")
    bystanders = [q.add("slow", kwargs={"seconds": 0.2}) for _ in range(6)]
    started = []
    deadline = time.monotonic() + 60
    while redis.xlen(q.keys.dlq) == 0 or not settled(redis, "c-journal"):
        assert time.monotonic() < deadline, "the queue never settled"
        if not started or started[-1].poll() is not None:
            if started:  # its supervisor would record the death: see Workers.bury
                workers.bury(redis, started[-1], "c-journal")
            assert len(started) < 5, f"the pill killed {len(started)} workers"
            started.append(workers.start("c-journal", visibility_ms=1000, concurrency=8))
        time.sleep(0.05)

    ran_in: dict[str, set[int]] = {}
    for run in read_runs(redis):
        ran_in.setdefault(run.job_id, set()).add(run.pid)
    wrongly_charged = {}
    for entry in dlq_entries(redis, "c-journal"):
        job = decode(entry["j"])
        charged = {int(e["worker"].split(":")[1]) for e in job.errors if e.get("class") == "WorkerLost"}
        if charged - ran_in.get(job.id, set()):
            wrongly_charged[job.id] = (sorted(charged), sorted(ran_in.get(job.id, set())))
    assert not wrongly_charged, (
        f"jobs charged the death of a worker they never ran in (charged pids, pids where they ran): {wrongly_charged}")
    assert len(ran_in[pill.job_id]) <= 2, f"the pill ran in {len(ran_in[pill.job_id])} workers, killing each"
    assert {b.job_id for b in bystanders} <= set(ran_in)
