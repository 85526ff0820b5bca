"""The path a Django user takes: ``@task`` + ``.enqueue()`` / ``.enqueue_many()`` + ``manage.py runworker``.

Each scenario has an engine twin (``queue-add``, ``queue-add-bulk``,
``worker-concurrent``, ``worker-sync``, ``worker-retry``) measured in the same
run, and the report shows it as a fraction of that twin: what the Django
layer costs.

The runworker scenarios start the real ``python manage.py runworker``
process on a preloaded backlog and time it from its first job (job 0 marks
the server time it started) to its last (the server-time id of the events
entry that acknowledged the last jobs), so Django's start-up is not counted
and nothing slows the jobs between.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from chasqui_core.engine.keys import GROUP, QueueKeys

from .child import PROFILE_DIR_ENV, ROOT, profiler_for
from .results import RATE, BenchError, Measurement
from .stats import median

SETTINGS = "bench.django_settings"


def _setup():
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()
    from . import tasks

    return tasks


# --- enqueue -----------------------------------------------------------------------------------


def django_enqueue(ctx) -> list[Measurement]:
    tasks = _setup()
    enqueue = tasks.noop.enqueue

    def once(n: int) -> tuple[int, float, float]:
        calls = []
        t0 = time.perf_counter()
        for i in range(n):
            c0 = time.perf_counter_ns()
            enqueue(i)
            calls.append(time.perf_counter_ns() - c0)
        seconds = time.perf_counter() - t0
        return n, seconds, median(calls) / 1000

    n = ctx.size(10_000, 300)
    runs = ctx.repeat(once, n)
    return [
        Measurement("django-enqueue", "django-enqueue (loop)", RATE, [jobs / s for jobs, s, _ in runs], jobs=n,
                    note=f"Django @task(...).enqueue() {n} times in a row ({tasks.noop.module_path})"),
        Measurement("django-enqueue", "django-enqueue (one call, median)", "µs", [us for _, _, us in runs], jobs=n,
                    lower_is_better=True, note="time of a single enqueue() call"),
    ]


def django_enqueue_many(ctx) -> list[Measurement]:
    tasks = _setup()
    if not hasattr(tasks.noop, "enqueue_many"):
        return [Measurement("django-enqueue-many", "django-enqueue-many", RATE, skipped="task.enqueue_many is missing")]
    chunk = 1000

    def once(n: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            tasks.noop.enqueue_many([((i,), {}) for i in range(start, min(n, start + chunk))])
        return n, time.perf_counter() - t0

    n = ctx.size(100_000, 2_000)
    return [Measurement("django-enqueue-many", "django-enqueue-many", RATE, ctx.rates(once, n), jobs=n,
                        note=f"task.enqueue_many of {chunk} (args, kwargs) calls at a time, building them included")]


# --- runworker -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunworkerSetup:
    task: str
    concurrency: int
    full: int
    smoke: int
    note: str
    retries: bool = False


SETUPS = {
    "runworker-async": RunworkerSetup("anoop", 100, 100_000, 2_000, "async def noop task, --concurrency 100"),
    "runworker-sync": RunworkerSetup("noop", 10, 50_000, 1_000, "def noop task, --concurrency 10 (threads)"),
    "runworker-retry": RunworkerSetup("fail_once", 100, 50_000, 1_000,
                                      "async task failing on its first run (1 ms backoff), then succeeding; "
                                      "--concurrency 100; successes per second", retries=True),
}


def _preload(tasks, task_name: str, n: int) -> None:
    task = getattr(tasks, task_name)
    for start in range(0, n, 1000):
        task.enqueue_many([((i,), {}) for i in range(start, min(n, start + 1000))])


def _settled(client, n: int) -> bool:
    keys = QueueKeys.for_queue("bench-django")
    if client.xlen(keys.stream) or client.zcard(keys.delayed):
        return False
    return client.xpending(keys.stream, GROUP)["pending"] == 0


def _last_completion_ms(client) -> int:
    keys = QueueKeys.for_queue("bench-django")
    for entry_id, fields in client.xrevrange(keys.events, count=50):
        if fields.get(b"type") == b"completed":
            return int(entry_id.split(b"-")[0])
    raise BenchError("no completed event found: the worker settled nothing")


def _drain(ctx, setup: RunworkerSetup, tasks, n: int) -> float:
    """Start runworker on a preloaded backlog of n jobs; return jobs per second from first job to last."""
    from .tasks import FIRST_KEY

    ctx.flush()
    _preload(tasks, setup.task, n)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "REDIS_URL": ctx.url,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    log = tempfile.TemporaryFile()  # not a pipe: a worker logging more than a pipe holds would block on it
    proc = subprocess.Popen([sys.executable, "manage.py", "runworker", "bench-django",
                             "--concurrency", str(setup.concurrency)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    profiler = profiler_for(f"runworker-{setup.task}", proc.pid) if os.environ.get(PROFILE_DIR_ENV) else None
    try:
        deadline = time.monotonic() + max(120.0, n / 200)
        while not _settled(ctx.client, n):
            if proc.poll() is not None:
                raise BenchError(f"runworker exited with code {proc.returncode} before draining: {_tail(log)}")
            if time.monotonic() > deadline:
                raise BenchError(f"runworker did not drain {n} jobs in time")
            time.sleep(0.005)
        first = ctx.client.get(FIRST_KEY)
        if first is None:
            raise BenchError("job 0 never marked its start")
        last = _last_completion_ms(ctx.client)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if profiler is not None:
            profiler.wait(timeout=30)
    if proc.returncode != 0:
        raise BenchError(f"runworker exited with code {proc.returncode} after SIGTERM: {_tail(log)}")
    keys = QueueKeys.for_queue("bench-django")
    if ctx.client.xlen(keys.dlq):
        raise BenchError(f"{ctx.client.xlen(keys.dlq)} jobs were dead-lettered: the run is not a clean drain")
    seconds = max(last - int(first), 1) / 1000
    return n / seconds


def _tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-2000:]


def runworker(ctx, name: str) -> list[Measurement]:
    setup = SETUPS[name]
    tasks = _setup()
    n = ctx.size(setup.full, setup.smoke)
    _drain(ctx, setup, tasks, ctx.warmup_size(n))
    rates = [_drain(ctx, setup, tasks, n) for _ in range(ctx.repeats)]
    return [Measurement(name, name, RATE, rates, jobs=n,
                        note=f"python manage.py runworker, {setup.note}; timed from its first job to its last")]
