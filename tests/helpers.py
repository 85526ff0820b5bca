"""Helpers shared by every test folder (fixtures live in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from chasqui_core.engine.store.connection import aconnect, is_cluster_client
from chasqui_core.engine.jobs.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.recovery.reclaim import reclaim_abandoned
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.worker.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
"""The project's folder: where ``manage.py`` is, and the working directory of the processes tests start."""


def subprocess_database_url() -> str:
    """The test database as a ``DATABASE_URL``, so a worker or server the test starts sees the same rows."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def keys_matching(client, pattern: str) -> list[bytes]:
    """KEYS ``pattern`` on the one server, or on every master of a cluster (redis-py asks one node otherwise)."""
    if is_cluster_client(client):
        return list(client.keys(pattern, target_nodes=client.PRIMARIES))
    return list(client.keys(pattern))


def info_per_server(client, section: str) -> list[dict]:
    """INFO ``section`` of the one server, or of every master of a cluster, in a stable order."""
    if is_cluster_client(client):
        replies = client.info(section, target_nodes=client.PRIMARIES)
        return [replies[name] for name in sorted(replies)]
    return [client.info(section)]


def reset_stats(client) -> None:
    """CONFIG RESETSTAT on the one server, or on every master of a cluster."""
    if is_cluster_client(client):
        client.config_resetstat(target_nodes=client.PRIMARIES)
    else:
        client.config_resetstat()


# --- workers in the test process ------------------------------------------------------------------------


def run_until(worker: Worker, until, timeout: float = 30.0) -> None:
    """Run ``worker`` in an event loop of this thread until ``until()`` holds or ``timeout`` passes, then stop it."""

    async def main() -> None:
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        worker.request_stop()
        await runner

    asyncio.run(main())


@contextmanager
def worker_running(redis_url: str, queues, registry: HandlerRegistry, **options):
    """A real worker on its own thread and loop for the block's length; stopped (and checked) at the end.

    Quick to react (short reads, heartbeats and promoter polls); ``options`` go to ``Worker``."""
    options = {"concurrency": 4, "block_ms": 50, "install_signal_handlers": False, "heartbeat_interval": 0.2,
               "promoter_poll_interval": 0.02, "shutdown_timeout": 5, **options}
    worker = Worker(list(queues), registry, url=redis_url, **options)
    thread = threading.Thread(target=worker.run_sync, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"


class WorkerThread:
    """A Worker running in a thread of the test process, stopped on ``stop()``."""

    def __init__(self, queues: list[str], registry: HandlerRegistry, url: str, **options) -> None:
        self.worker = Worker(queues, registry, url=url, install_signal_handlers=False, block_ms=200,
                             heartbeat_interval=0.2, **options)
        self.thread = threading.Thread(target=self.worker.run_sync, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"


# --- dead-letter entries, written the way settle.lua writes them ------------------------------------------

TASK = "tests.django.sample_tasks.add"
"""A task every Django test process knows (tests/django/sample_tasks.py), so its dead jobs can be replayed."""


def _traceback(cls: str, message: str) -> str:
    return f"Traceback (most recent call last):\n  File \"tasks.py\", line 9\n{cls}: {message}\n"


def error_history(messages, cls: str = "ValueError") -> list[dict]:
    """One error record per message, as a worker writes them: run n failed with ``messages[n - 1]``."""
    return [
        error_record(attempt=i + 1, exc_class=cls, message=m, traceback=_traceback(cls, m),
                     worker="host-1:4242:abcd", started_at=1_700_000_000_000 + i * 1000,
                     finished_at=1_700_000_000_020 + i * 1000)
        for i, m in enumerate(messages)
    ]


def dead_job(task: str = TASK, *, args=(1, 2), kwargs=None, messages=("boom",), cls: str = "ValueError",
             job_id: str | None = None, replays: int = 0) -> Job:
    """A job that failed once per message and ran out of attempts."""
    errors = error_history(messages, cls)
    return Job(job_id or new_job_id(), task, list(args), dict(kwargs or {}), attempt=len(errors),
               created_at=now_ms(), max_attempts=len(errors), errors=errors, replays=replays)


def dead_fields(job: Job, reason: str = "retries_exhausted") -> dict:
    """The fields of the job's dead-letter entry."""
    last = job.errors[-1] if job.errors else {}
    return {"j": job.encode(), "reason": reason, "task": job.task, "job_id": job.id, "source_id": "1-0",
            "error_class": last.get("class", ""), "error": last.get("message", "")}


def add_dead(redis, queue: str, job: Job | None = None, reason: str = "retries_exhausted", **job_kw) -> str:
    """Dead-letter ``job`` (or ``dead_job(**job_kw)``) in ``queue``; returns the entry id."""
    job = job or dead_job(**job_kw)
    redis.sadd(QUEUES_REGISTRY, queue)
    return redis.xadd(QueueKeys.for_queue(queue).dlq, dead_fields(job, reason)).decode()


def bulk_dead(redis, queue: str, n: int, *, task: str = TASK, cls: str = "ValueError",
              message: str = "row {i} failed") -> list[str]:
    """``n`` dead entries, one pipeline per 5,000; returns their entry ids, oldest first.

    Entry i's only error says ``message.format(i=i)``, so a filter can find exactly one of them.
    """
    redis.sadd(QUEUES_REGISTRY, queue)
    key = QueueKeys.for_queue(queue).dlq
    [record] = error_history(["-"], cls)
    created = now_ms()
    ids: list[str] = []
    for start in range(0, n, 5000):
        pipe = redis.pipeline(transaction=False)
        for i in range(start, min(n, start + 5000)):
            text = message.format(i=i)
            job = Job(new_job_id(), task, [i, 0], {}, attempt=1, created_at=created, max_attempts=1,
                      errors=[{**record, "message": text, "traceback": _traceback(cls, text)}])
            pipe.xadd(key, dead_fields(job))
        ids += [r.decode() for r in pipe.execute()]
    return ids


def reclaim_now(redis_url: str, keys: QueueKeys, *, min_idle_ms: int):
    """One reclaim pass, as any live worker runs it, by a consumer that reads nothing itself."""

    async def main():
        client = aconnect(redis_url)
        try:
            return await reclaim_abandoned(Scripts(client), keys, "reclaimer", min_idle_ms=min_idle_ms)
        finally:
            await client.aclose()

    return asyncio.run(main())


class OperationsRunner:
    """Runs the DLQ operations of some queues in a thread, as a worker's operations part does (same engine code),
    without running their jobs: for tests of the console and the API that follow an operation to its end."""

    def __init__(self, redis_url: str, queues: list[str]) -> None:
        from chasqui_core.engine.store.connection import connect

        self.client = connect(redis_url)
        self.queues = queues
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="test-operations-runner", daemon=True)

    def _run(self) -> None:
        from chasqui_core.engine.dlq.operations import run_pending

        while not self.stopping.is_set():
            for q in self.queues:
                run_pending(self.client, q, "test-runner", should_stop=self.stopping.is_set)
            self.stopping.wait(0.05)

    def __enter__(self) -> OperationsRunner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.client.close()
