"""The Django path's workers: the real ``python manage.py runworker`` draining a preloaded backlog.

Each scenario mirrors an engine worker scenario (its *twin*, bench/consumer.py)
with the same handler kind, concurrency and backlog, but the jobs are the
bench's Django Tasks (bench/django_app/tasks.py), enqueued through Django,
and the worker is the command a Django user runs, in a process of its own.

Django's start-up is not throughput, so the window is not the process's life:
it opens when the first job starts (the task writes the time to Redis) and
closes when the bench sees the last job's outcome acknowledged in Redis
(woken by the task that made the target-th success, then polling every
half millisecond until the stream and the delayed set are empty). Every
drain is a fresh process, stopped with SIGTERM, which must exit cleanly; then
the queue is checked for leftovers, as for the twins.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from chasqui_core.engine.keys import QueueKeys
from chasqui_core.engine.queue import JobSpec, Queue

from . import consumer, django_app
from .child import ROOT, start_profiler, stop_profiler
from .results import RATE, BenchError, Measurement
from .stats import median

START_TIMEOUT = 120.0
"""Seconds a fresh ``runworker`` may take to start its first job (Django start-up on a busy machine)."""
STOP_TIMEOUT = 60.0
"""Seconds a ``runworker`` process may take to exit after SIGTERM (its own shutdown timeout is 25 s)."""
SETTLE_POLL = 0.0005


@dataclass(frozen=True, slots=True)
class RunworkerSetup:
    task: str
    """The task in bench/django_app/tasks.py."""
    twin: str
    """The engine scenario it mirrors: same handler kind, concurrency and backlog size."""
    note: str

    @property
    def concurrency(self) -> int:
        return consumer.SETUPS[self.twin].concurrency


SETUPS = {
    "runworker-async": RunworkerSetup("noop", "worker-concurrent", "concurrency 100, async def noop task"),
    "runworker-sync": RunworkerSetup("noop_sync", "worker-sync", "concurrency 10 (threads), def noop task"),
    "runworker-retry": RunworkerSetup("fail_once", "worker-retry",
                                      "concurrency 100; every job fails once, retried after 1 ms, then succeeds; "
                                      "successes per second"),
}


def preload(ctx, task, n: int) -> None:
    """Fill the queue through Django: ``enqueue_many`` where the tasks have it, else the jobs enqueue() writes."""
    if hasattr(task, "enqueue_many"):
        task.enqueue_many([((i,), {}) for i in range(n)])
    else:
        q = Queue(task.queue_name, redis_client=ctx.client)
        q.add_bulk(JobSpec(task.module_path, [i], meta={"backend": task.backend}) for i in range(n))
    length = ctx.client.xlen(QueueKeys.for_queue(task.queue_name).stream)
    if length != n:
        raise BenchError(f"preloading {n} jobs left {length} in the stream")


class RunworkerProcess:
    """``python manage.py runworker`` with the bench's settings, output to a file; always stopped on exit."""

    def __init__(self, name: str, queue: str, concurrency: int, target: int) -> None:
        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = django_app.SETTINGS
        env[django_app.TARGET_ENV] = str(target)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", queue, "--concurrency", str(concurrency)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self._profiler = start_profiler(self.proc.pid, name)

    def __enter__(self) -> "RunworkerProcess":
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        try:
            if exc_type is None:
                self.stop()
            elif self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        finally:
            stop_profiler(self._profiler)
            self.log.close()

    def output(self, lines: int = 30) -> str:
        self.log.flush()
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").splitlines()[-lines:]
        return "\n".join("      " + line for line in tail) or "      (no output)"

    def exited(self) -> BenchError | None:
        """An error describing the process's early exit, or None while it runs."""
        code = self.proc.poll()
        if code is None:
            return None
        return BenchError(f"runworker exited with code {code} before the drain ended; its last lines:\n"
                          f"{self.output()}")

    def stop(self) -> None:
        """SIGTERM, as a deployment stops a worker; it must exit, with code 0, within STOP_TIMEOUT."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise BenchError(f"runworker did not exit within {STOP_TIMEOUT:.0f} s of SIGTERM; killed it. "
                                 f"Its last lines:\n{self.output()}") from None
        if self.proc.returncode != 0:
            raise BenchError(f"runworker exited with code {self.proc.returncode} after SIGTERM; its last lines:\n"
                             f"{self.output()}")


def wait_done(ctx, worker: RunworkerProcess, timeout: float) -> None:
    """Block until the task that makes the target-th success says so (or the process dies)."""
    deadline = time.monotonic() + timeout
    while not ctx.client.blpop([django_app.DONE_KEY], timeout=1):
        error = worker.exited()
        if error is not None:
            raise error
        if time.monotonic() > deadline:
            done = int(ctx.client.hexists(django_app.MARKS_KEY, "first_wall"))
            raise BenchError(f"runworker did not finish its drain within {timeout:.0f} s "
                             f"({'it started jobs' if done else 'no job started'}); its last lines:\n"
                             f"{worker.output()}")


def wait_settled(ctx, queue: str) -> float:
    """The wall-clock time at which the stream and the delayed set are empty: every outcome acknowledged."""
    keys = QueueKeys.for_queue(queue)
    pipe = ctx.client.pipeline(transaction=False)
    while True:
        pipe.xlen(keys.stream)
        pipe.zcard(keys.delayed)
        left, delayed = pipe.execute()
        if not left and not delayed:
            return time.time()
        time.sleep(SETTLE_POLL)


def drain(ctx, name: str, setup: RunworkerSetup, task, n: int) -> dict:
    """One fresh ``runworker`` process drains ``n`` preloaded jobs; its window's jobs, seconds and CPU."""
    ctx.flush()
    preload(ctx, task, n)
    with RunworkerProcess(name, task.queue_name, setup.concurrency, target=n) as worker:
        wait_done(ctx, worker, timeout=START_TIMEOUT + max(120.0, n / 100))
        end = wait_settled(ctx, task.queue_name)
    consumer.check_settled(ctx.client, task.queue_name, n)
    marks = {k.decode(): float(v) for k, v in ctx.client.hgetall(django_app.MARKS_KEY).items()}
    return {"jobs": n, "seconds": end - marks["first_wall"], "cpu_seconds": marks["last_cpu"] - marks["first_cpu"]}


def run_setup(ctx, name: str) -> list[Measurement]:
    setup = SETUPS[name]
    task = getattr(django_app.setup(), setup.task)
    twin = consumer.SETUPS[setup.twin]
    n = ctx.size(twin.full, twin.smoke)
    # Every drain is a fresh process, so a warm-up warms only the server and the machine: worth it for a
    # measured run, not for a smoke run, whose numbers mean little anyway.
    sizes = ([] if ctx.smoke else [ctx.warmup_size(n)]) + [n] * ctx.repeats
    replies = [drain(ctx, name, setup, task, size) for size in sizes][-ctx.repeats:]
    cpu_us = median([r["cpu_seconds"] / r["jobs"] * 1e6 for r in replies])
    note = (f"{setup.note}; `manage.py runworker {task.queue_name} --concurrency {setup.concurrency}`, "
            f"a fresh process per drain, timed from its first job's start to its last job's outcome in Redis; "
            f"the worker process used {cpu_us:.1f} µs of CPU per job (median)")
    return [Measurement(name, name, RATE, [r["jobs"] / r["seconds"] for r in replies], jobs=n, note=note)]
