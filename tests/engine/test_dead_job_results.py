"""A job dead-lettered because its workers died still reports FAILED through its stored result.

Found by the accounting soak (``python -m bench soak``): a job that kills
its worker twice is dead-lettered as ``panic`` when a live worker picks it
up, and nothing writes its outcome: ``get_result()`` keeps whatever record
was there (READY, from its enqueue through Django or a failed run), as if it
were still to run, and a caller polling for it waits until the record
expires; here, on the engine alone, there is no record at all. Every other way
into the dead-letter queue (``retries_exhausted`` after a raised error,
``unrecoverable``) stores FAILED, and so does a refusal at pickup now.
"""

import time

import pytest

from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.results import decode_result
from tests.engine.worker_app import dlq_entries, settled


@pytest.mark.timeout(90)
def test_a_job_dead_lettered_as_panic_reports_failed(redis, workers):
    q = Queue("c-panic-result", redis_client=redis)
    job = q.add("die", result_ttl=600)
    started = []
    deadline = time.monotonic() + 60
    while redis.xlen(q.keys.dlq) == 0 or not settled(redis, "c-panic-result"):
        assert time.monotonic() < deadline, "the job never reached the dead-letter queue"
        if not started or started[-1].poll() is not None:
            if started:  # its supervisor would record the death: see Workers.bury
                workers.bury(redis, started[-1], "c-panic-result")
            assert len(started) < 4, f"the job killed {len(started)} workers"
            started.append(workers.start("c-panic-result", visibility_ms=1000))
        time.sleep(0.05)
    [entry] = dlq_entries(redis, "c-panic-result")
    assert entry["reason"] == b"panic"
    blob = redis.get(q.keys.result + job.job_id)
    assert blob is not None, "no outcome was stored for the dead job"
    assert decode_result(blob)["status"] == "FAILED", "a dead job must not report that it is still to run"
