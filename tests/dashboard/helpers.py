"""Building queue contents the way the engine writes them, for console tests."""

from __future__ import annotations

from chasqui_core.engine.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.keys import QUEUES_REGISTRY, QueueKeys


def failed_job(task="emails.tasks.send_welcome_email", *, messages=("SMTP server said 451",), cls="RuntimeError",
               args=(1,), kwargs=None, job_id=None, replays=0) -> Job:
    errors = [
        error_record(attempt=i + 1, exc_class=cls, message=m,
                     traceback=f"Traceback (most recent call last):\n  File \"tasks.py\", line 9\n{cls}: {m}\n",
                     worker="host-1:4242:abcd", started_at=1_700_000_000_000 + i * 1000,
                     finished_at=1_700_000_000_020 + i * 1000)
        for i, m in enumerate(messages)
    ]
    return Job(job_id or new_job_id(), task, list(args), dict(kwargs or {}), attempt=len(errors),
               created_at=now_ms(), max_attempts=len(errors), errors=errors, replays=replays)


def dlq_fields(job: Job, reason: str = "retries_exhausted") -> dict:
    """The fields settle.lua writes for a dead job."""
    last = job.errors[-1] if job.errors else {}
    return {"j": job.encode(), "reason": reason, "task": job.task, "job_id": job.id, "source_id": "1-0",
            "error_class": last.get("class", ""), "error": last.get("message", "")}


def add_dead(redis, queue: str, job: Job, reason: str = "retries_exhausted") -> str:
    keys = QueueKeys.for_queue(queue)
    redis.sadd(QUEUES_REGISTRY, queue)
    return redis.xadd(keys.dlq, dlq_fields(job, reason)).decode()


def bulk_dead(redis, queue: str, n: int, *, chunk: int = 10_000) -> list[str]:
    """``n`` dead entries XADDed in pipelines; their ids, oldest first."""
    keys = QueueKeys.for_queue(queue)
    redis.sadd(QUEUES_REGISTRY, queue)
    template = failed_job(messages=("row failed",))
    ids: list[str] = []
    for start in range(0, n, chunk):
        pipe = redis.pipeline(transaction=False)
        for i in range(start, min(n, start + chunk)):
            job = Job(f"job-{i:07d}", template.task, [i], {}, attempt=1, created_at=template.created_at,
                      max_attempts=1, errors=[{**template.errors[0], "message": f"row {i} failed"}])
            fields = dlq_fields(job)
            pipe.xadd(keys.dlq, fields)
        ids += [r.decode() for r in pipe.execute()]
    return ids
