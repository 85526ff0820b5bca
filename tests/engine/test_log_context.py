"""A run's failure reaches logging with the job's context (``record.chasqui``): a job failed for good is a
WARNING record, a failure that will be retried an INFO one, each naming the job, its queue, task, attempt and
outcome, for any handler (an error tracker's logging integration, a JSON formatter) to show."""

from __future__ import annotations

import logging

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.worker_app import wait_for
from tests.helpers import worker_running


class Boom(ValueError):
    pass


def test_each_failed_run_is_a_record_with_the_jobs_context(redis, redis_url, caplog):
    keys = QueueKeys.for_queue("log-context")
    registry = HandlerRegistry()

    def broken(n: int) -> None:
        raise Boom(f"card {n} declined")

    registry.register("t.broken", broken, max_attempts=2, backoff=1)
    caplog.set_level(logging.INFO, logger="chasqui.worker")
    job = Queue(keys.queue, url=redis_url).add("t.broken", [7])
    with worker_running(redis_url, [keys.queue], registry):
        wait_for(lambda: int(redis.xlen(keys.dlq)) == 1, 20, "the job to fail twice and be dead-lettered")
    records = [r for r in caplog.records if getattr(r, "chasqui", None) and r.chasqui["job_id"] == job.job_id]
    retried, dead = records
    assert retried.levelno == logging.INFO and retried.exc_info is None
    assert retried.chasqui == {"job_id": job.job_id, "queue": keys.queue, "task": "t.broken", "attempt": 1,
                               "outcome": "retrying", "entry_id": job.entry_id}
    assert dead.levelno == logging.WARNING and dead.chasqui["outcome"] == "retries_exhausted"
    assert dead.chasqui["attempt"] == 2 and "Boom: card 7 declined" in dead.getMessage()
