"""Building queue state the way the engine writes it, for the API and CLI tests."""

from __future__ import annotations

import time

import msgpack

from chasqui_core.engine.envelope import Job, decode, error_record, new_job_id, now_ms
from chasqui_core.engine.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.queue import Queue

TASK = "tests.django.sample_tasks.add"


def error_history(messages, cls="ValueError") -> list[dict]:
    return [
        error_record(attempt=i + 1, exc_class=cls, message=m,
                     traceback=f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{cls}: {m}\n",
                     worker="w1", started_at=1_000, finished_at=1_020)
        for i, m in enumerate(messages)
    ]


def dead_job(task=TASK, *, args=(1, 2), kwargs=None, messages=("boom",), cls="ValueError", job_id=None) -> Job:
    errors = error_history(messages, cls)
    return Job(job_id or new_job_id(), task, list(args), dict(kwargs or {}), attempt=len(errors),
               created_at=now_ms(), max_attempts=len(errors), errors=errors)


def dead_fields(job: Job, reason: str = "retries_exhausted") -> dict:
    """The fields settle.lua writes for a dead job."""
    last = job.errors[-1] if job.errors else {}
    return {"j": job.encode(), "reason": reason, "task": job.task, "job_id": job.id, "source_id": "1-0",
            "error_class": last.get("class", ""), "error": last.get("message", "")}


def add_dead(redis, queue: str, job: Job | None = None, reason: str = "retries_exhausted", **job_kw) -> str:
    job = job or dead_job(**job_kw)
    redis.sadd(QUEUES_REGISTRY, queue)
    return redis.xadd(QueueKeys.for_queue(queue).dlq, dead_fields(job, reason)).decode()


def bulk_dead(redis, queue: str, n: int, *, task=TASK, cls="ValueError", message="row {i} failed") -> list[str]:
    """``n`` dead entries, one pipeline per 5,000; returns their entry ids, oldest first."""
    redis.sadd(QUEUES_REGISTRY, queue)
    key = QueueKeys.for_queue(queue).dlq
    ids: list[str] = []
    for start in range(0, n, 5000):
        pipe = redis.pipeline(transaction=False)
        for i in range(start, min(n, start + 5000)):
            pipe.xadd(key, dead_fields(dead_job(task, args=(i, 0), messages=(message.format(i=i),), cls=cls)))
        ids += [r.decode() for r in pipe.execute()]
    return ids


def stream_jobs(redis, queue: str) -> list[Job]:
    return [decode(fields[b"j"]) for _, fields in redis.xrange(QueueKeys.for_queue(queue).stream)]


def dlq_len(redis, queue: str) -> int:
    return int(redis.xlen(QueueKeys.for_queue(queue).dlq))


def add_delayed(redis, queue: str, *, delay_ms: int = 3_600_000, task=TASK, args=(1, 2), kwargs=None) -> str:
    return Queue(queue, redis_client=redis).add(task, list(args), kwargs or {}, delay=delay_ms).job_id


def server_ms(redis) -> int:
    seconds, micros = redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def heartbeat(redis, queues, worker_id: str, *, age_ms: int = 0, in_flight: int = 0, processed: int = 0,
              current=(), rss_kb: int = 0, supervisor: int | None = None) -> None:
    """Write a heartbeat as a worker does; ``current`` holds (task, job id, started at ms) triples."""
    info = msgpack.packb({
        "id": worker_id, "host": "box-1", "pid": 4242, "queues": list(queues), "concurrency": 8,
        "in_flight": in_flight, "processed": processed, "failed": 1,
        "started_at": server_ms(redis) - 60_000, "last_seen": server_ms(redis) - age_ms,
        "current": [list(job) for job in current], "rss_kb": rss_kb, "supervisor": supervisor,
    })
    for q in queues:
        redis.sadd(QUEUES_REGISTRY, q)
        redis.hset(QueueKeys.for_queue(q).workers, worker_id, info)


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")
