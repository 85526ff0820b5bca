"""Dead-letter entries for the DLQ tests, written with the fields settle.lua (or reclaim.lua) writes."""

from chasqui_core.engine.jobs.envelope import Job, decode, error_record, new_job_id, now_ms
from chasqui_core.engine.store.keys import QueueKeys


Q = "dlqtest"
KEYS = QueueKeys.for_queue(Q)


# --- building DLQ entries --------------------------------------------------------


def err(message, cls="ValueError", attempt=1):
    return error_record(attempt=attempt, exc_class=cls, message=message,
                        traceback=f"Traceback (most recent call last):\n  ...\n{cls}: {message}\n",
                        worker="w1", started_at=1_000, finished_at=1_020)


def dead_job(task="emails.send", *, messages=("boom",), cls="ValueError", job_id=None, replays=0):
    errors = [err(m, cls, i + 1) for i, m in enumerate(messages)]
    return Job(job_id or new_job_id(), task, [1, "x"], {"k": 2}, attempt=len(errors), created_at=now_ms(),
               errors=errors, replays=replays)


def fields_for(job, reason="retries_exhausted", *, error_class=None, error=None, lua_panic=False,
               source_id="1-0", payload=None):
    """The fields settle.lua (or reclaim.lua, for ``lua_panic``) writes."""
    if lua_panic:
        return {"j": job.encode(), "reason": "panic", "task": "", "job_id": "", "source_id": source_id,
                "error_class": "WorkerLost", "error": "the job was running when its worker died 2 times",
                "deliveries": 3}
    last = job.errors[-1] if job is not None and job.errors else {}
    return {
        "j": payload if payload is not None else job.encode(), "reason": reason,
        "task": job.task if job is not None else "", "job_id": job.id if job is not None else "",
        "source_id": source_id,
        "error_class": error_class if error_class is not None else last.get("class", ""),
        "error": error if error is not None else last.get("message", ""),
    }


def add_dead(redis, job, reason="retries_exhausted", *, entry_id="*", **kw) -> str:
    return redis.xadd(KEYS.dlq, fields_for(job, reason, **kw), id=entry_id).decode()


def bulk_dead(redis, n, **kw) -> tuple[list[str], list[str]]:
    """n entries in one pipeline per 5,000; returns (entry ids, job ids), oldest first."""
    entry_ids, job_ids = [], []
    for start in range(0, n, 5000):
        pipe = redis.pipeline(transaction=False)
        for i in range(start, min(n, start + 5000)):
            job = dead_job(messages=(f"row {i} failed",), **kw)
            job_ids.append(job.id)
            pipe.xadd(KEYS.dlq, fields_for(job))
        entry_ids += [r.decode() for r in pipe.execute()]
    return entry_ids, job_ids


def stream_jobs(redis) -> list[Job]:
    return [decode(f[b"j"]) for _, f in redis.xrange(KEYS.stream)]
