"""A worker process for the engine's end-to-end tests, and the helpers that drive it.

Run as a program, it registers the test handlers below and runs ``Worker``
until SIGTERM::

    python tests/engine/worker_app.py --url URL --queue q [--concurrency N]
        [--visibility-ms N] [--lock-ttl-ms N] [--poll S] ...

Tests live in another process, so every handler records each run by RPUSHing
``"<job id> <attempt> <pid> <epoch ms>"`` to a Redis list: the job's ``log``
kwarg, or ``RUNS_KEY``. From that list a test can tell how often each job ran,
on which worker process, with which attempt number, and when.

Imported (by the tests), it offers ``Workers``, which starts worker processes
and always stops them, and ``read_runs``/``wait_for`` to observe them. The
engine is only imported when the program runs, so importing this is cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().relative_to(ROOT)

RUNS_KEY = "e2e:runs"
"""Where handlers record their runs when the job names no ``log`` list."""

DONE_SUFFIX = ":done"
SPANS_SUFFIX = ":spans"
HISTORY_SUFFIX = ":history"
"""``span`` and ``span_sync`` record each run's start and end on ``<log>:spans``."""
"""``slow`` and ``block`` also record the end of a run on ``<log>:done``."""


# --- the worker program -------------------------------------------------------------

TASK_MAX_ATTEMPTS = 2
TASK_BACKOFF_MS = 250
"""Task-level defaults of ``fail_n_times_limited``."""


class UnrecoverableError(Exception):
    """Unrelated to the engine's class of that name: only the name is shared.

    Other libraries define their own ``UnrecoverableError``; the worker must
    honour any class so named, not just the one in ``chasqui_core``.
    """


def _build_registry(client):
    from chasqui_core.engine.jobs.backoff import BackoffSpec
    from chasqui_core.engine.jobs.errors import RetryAfter
    from chasqui_core.engine.jobs.errors import UnrecoverableError as ChasquiUnrecoverable
    from chasqui_core.engine.jobs.registry import HandlerRegistry

    class BadInput(ChasquiUnrecoverable):
        """A subclass: the worker must look at the bases too."""

    pid = os.getpid()

    def record(ctx, log: str) -> None:
        client.rpush(log, f"{ctx.job.id} {ctx.attempt} {pid} {int(time.time() * 1000)}")

    def run_number(ctx, log: str) -> int:
        """How many times this job has started, across every worker process."""
        return client.incr(f"{log}:count:{ctx.job.id}")

    def noop(ctx, *_args, log: str = RUNS_KEY, **_):
        record(ctx, log)

    def echo(ctx, value, log: str = RUNS_KEY, **_):
        record(ctx, log)
        return value

    async def slow(ctx, seconds: float, log: str = RUNS_KEY, **_):
        record(ctx, log)
        await asyncio.sleep(seconds)
        client.rpush(log + DONE_SUFFIX, ctx.job.id)

    def block(ctx, seconds: float, log: str = RUNS_KEY, **_):
        record(ctx, log)
        time.sleep(seconds)
        client.rpush(log + DONE_SUFFIX, ctx.job.id)

    def noted(ctx, seconds: float, log: str = RUNS_KEY, **_):
        """``block``, noting first what the job's envelope says of its past (deaths, error classes and workers)."""
        record(ctx, log)
        client.rpush(log + HISTORY_SUFFIX, json.dumps([ctx.job.id, ctx.attempt, ctx.job.deaths,
                                                       [[e.get("class"), e.get("worker")] for e in ctx.job.errors]]))
        time.sleep(seconds)
        client.rpush(log + DONE_SUFFIX, ctx.job.id)

    def fail_n_times(ctx, n: int, log: str = RUNS_KEY, **_):
        record(ctx, log)
        run = run_number(ctx, log)
        if run <= n:
            raise RuntimeError(f"planned failure {run} of {n}")
        return run

    def unrecoverable(ctx, log: str = RUNS_KEY, **_):
        record(ctx, log)
        raise BadInput("this job can never succeed")

    def foreign_unrecoverable(ctx, log: str = RUNS_KEY, **_):
        record(ctx, log)
        raise UnrecoverableError("another library gave up on this job")

    def die(ctx, log: str = RUNS_KEY, **_):
        record(ctx, log)
        os._exit(1)

    async def die_at_once(ctx, log: str = RUNS_KEY, **_):
        """An async job that kills its process before its first await: no start mark can be written for it."""
        record(ctx, log)
        os._exit(1)

    def ends_then_dies_once(ctx, log: str = RUNS_KEY, **_):
        """On its first run, its code returns and the process dies while its wrapper is still busy (Django's
        signals, logging a failure): the wrapper said the run had ended first (``run_returned``)."""
        record(ctx, log)
        run = run_number(ctx, log)
        ctx.run_returned()
        if run == 1:
            os._exit(1)

    async def quick(ctx, *_args, log: str = RUNS_KEY, **_):
        """An async job that never waits: it runs to its end inside the worker's round of starts."""
        record(ctx, log)
        client.rpush(log + DONE_SUFFIX, ctx.job.id)

    async def hog(ctx, seconds: float, log: str = RUNS_KEY, **_):
        """An async job that blocks the event loop (CPU-bound code in an async def): nothing else runs on it."""
        record(ctx, log)
        time.sleep(seconds)

    def die_after(ctx, job_id: str, pause: float, log: str = RUNS_KEY, **_):
        """On its first run, kills the process ``pause`` s after job ``job_id`` recorded its run; then succeeds."""
        record(ctx, log)
        if run_number(ctx, log) > 1:
            return
        deadline = time.monotonic() + 20
        while not any(line.split()[0] == job_id.encode() for line in client.lrange(log, 0, -1)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(pause)
        os._exit(1)

    def die_on_signal(ctx, key: str, log: str = RUNS_KEY, **_):
        """On its first run, waits until ``key`` exists in Redis, then kills the process; later runs succeed."""
        record(ctx, log)
        if run_number(ctx, log) > 1:
            return
        deadline = time.monotonic() + 30
        while not client.exists(key) and time.monotonic() < deadline:
            time.sleep(0.02)
        os._exit(1)

    def retry_after(ctx, seconds: float, n: int = 1, log: str = RUNS_KEY, **_):
        record(ctx, log)
        if run_number(ctx, log) <= n:
            raise RetryAfter(seconds, "the remote side asked us to come back later")

    async def span(ctx, seconds: float, log: str = RUNS_KEY, **_):
        """Records its whole run, "<job id> <pid> <start ms> <end ms>" on ``<log>:spans``, when it ends."""
        start = time.time()
        await asyncio.sleep(seconds)
        client.rpush(log + SPANS_SUFFIX, f"{ctx.job.id} {pid} {int(start * 1000)} {int(time.time() * 1000)}")

    def span_sync(ctx, seconds: float, log: str = RUNS_KEY, **_):
        start = time.time()
        time.sleep(seconds)
        client.rpush(log + SPANS_SUFFIX, f"{ctx.job.id} {pid} {int(start * 1000)} {int(time.time() * 1000)}")

    def obedient(ctx, seconds: float, log: str = RUNS_KEY, **_):
        """A sync job that checks for a cancel between steps, and reports its progress at each."""
        record(ctx, log)
        steps = int(seconds / 0.05)
        for step in range(steps):
            ctx.report_progress(100 * step / steps, f"step {step} of {steps}")
            if ctx.cancelled:
                client.rpush(log + ":told", ctx.job.id)
            ctx.check_cancelled()
            time.sleep(0.05)
        client.rpush(log + DONE_SUFFIX, ctx.job.id)

    registry = HandlerRegistry()
    registry.register("span", span, takes_context=True)
    registry.register("span_sync", span_sync, takes_context=True)
    for name, fn in [("noop", noop), ("echo", echo), ("slow", slow), ("block", block), ("fail_n_times", fail_n_times),
                     ("unrecoverable", unrecoverable), ("foreign_unrecoverable", foreign_unrecoverable),
                     ("die", die), ("obedient", obedient), ("hog", hog), ("die_after", die_after),
                     ("noted", noted), ("die_on_signal", die_on_signal),
                     ("die_at_once", die_at_once), ("quick", quick), ("ends_then_dies_once", ends_then_dies_once)]:
        registry.register(name, fn, takes_context=True)
    registry.register("retry_after", retry_after, takes_context=True, backoff="retry_after")
    # the middle layer of the retry budget: task defaults, below the job's own options
    registry.register("fail_n_times_limited", fail_n_times, takes_context=True,
                      max_attempts=TASK_MAX_ATTEMPTS, backoff=BackoffSpec.fixed(TASK_BACKOFF_MS))
    return registry


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run a Chasqui worker with the end-to-end test handlers.")
    p.add_argument("--url", required=True)
    p.add_argument("--queue", action="append", required=True, help="may be given more than once")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--block-ms", type=int, default=1000)
    p.add_argument("--visibility-ms", type=int, default=30_000)
    p.add_argument("--lock-ttl-ms", type=int, default=5000)
    p.add_argument("--poll", type=float, default=0.1, help="promoter poll interval, seconds")
    p.add_argument("--max-payload-bytes", type=int, default=None)
    p.add_argument("--max-attempts", type=int, default=None, help="worker-wide retry budget")
    p.add_argument("--backoff-ms", type=float, default=None, help="worker-wide fixed backoff")
    p.add_argument("--shutdown-timeout", type=float, default=25.0)
    p.add_argument("--cancel-grace", type=float, default=10.0)
    p.add_argument("--flush-interval", type=float, default=0.002, help="the settler's flush interval, seconds")
    p.add_argument("--job-timeout", type=float, default=None, help="seconds a run may take (the worker's default)")
    p.add_argument("--record-url", default=None,
                   help="the server handlers record their runs on (default: --url); a test that restarts the "
                        "queue's server records elsewhere")
    p.add_argument("--signing-key", action="append", default=[],
                   help="a key signed jobs may be signed with; may be given more than once (none: no check)")
    p.add_argument("--limits", default=None, help="rate and concurrency limits, as JSON (CHASQUI['LIMITS'] form)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import logging

    from chasqui_core.engine.jobs.backoff import BackoffSpec
    from chasqui_core.engine.store.connection import connect
    from chasqui_core.engine.settle.retry import RetryPolicy
    from chasqui_core.engine.worker.worker import Worker

    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    client = connect(args.record_url or args.url)
    policy_options = {}
    if args.max_attempts is not None:
        policy_options["max_attempts"] = args.max_attempts
    if args.backoff_ms is not None:
        policy_options["backoff"] = BackoffSpec.fixed(args.backoff_ms)
    options = {}
    if args.max_payload_bytes is not None:
        options["max_payload_bytes"] = args.max_payload_bytes
    worker = Worker(
        args.queue, _build_registry(client), url=args.url, concurrency=args.concurrency,
        batch_size=args.batch_size, block_ms=args.block_ms, policy=RetryPolicy(**policy_options),
        visibility_timeout_ms=args.visibility_ms, promoter_poll_interval=args.poll,
        promoter_lock_ttl_ms=args.lock_ttl_ms, shutdown_timeout=args.shutdown_timeout,
        signing_keys=args.signing_key, limits=json.loads(args.limits) if args.limits else None,
        cancel_grace=args.cancel_grace, flush_interval=args.flush_interval, job_timeout=args.job_timeout, **options,
    )
    worker.run_sync()
    client.close()
    return 0


# --- helpers for the tests ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    job_id: str
    attempt: int
    pid: int
    at_ms: int


def read_runs(client, key: str = RUNS_KEY) -> list[Run]:
    out = []
    for raw in client.lrange(key, 0, -1):
        job_id, attempt, pid, at_ms = raw.decode().split()
        out.append(Run(job_id, int(attempt), int(pid), int(at_ms)))
    return out


@dataclass(frozen=True, slots=True)
class Span:
    job_id: str
    pid: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Seen:
    """What a ``noted`` run found in its job's envelope."""

    job_id: str
    attempt: int
    deaths: int
    errors: list[list[str]]
    """[error class, worker] per line of the job's error history."""


def read_histories(client, log: str = RUNS_KEY) -> list[Seen]:
    return [Seen(*json.loads(raw)) for raw in client.lrange(log + HISTORY_SUFFIX, 0, -1)]


def read_spans(client, log: str = RUNS_KEY) -> list[Span]:
    """The runs of ``span``/``span_sync`` jobs that ended, from their own clocks."""
    out = []
    for raw in client.lrange(log + SPANS_SUFFIX, 0, -1):
        job_id, pid, start, end = raw.decode().split()
        out.append(Span(job_id, int(pid), int(start), int(end)))
    return out


def most_at_once(spans: list[Span]) -> int:
    """The most spans under way at one moment (an end and a start at the same ms do not overlap)."""
    edges = sorted([(s.start_ms, 1) for s in spans] + [(s.end_ms, -1) for s in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def runs_by_job(runs: list[Run]) -> dict[str, list[Run]]:
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    return by_job


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Poll until ``predicate()`` is truthy and return its value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def settled(client, queue: str) -> bool:
    """Nothing left to do on ``queue``: its streams (every priority band's), pending lists and delayed set are
    empty."""
    from chasqui_core.engine.store.keys import GROUP, QueueKeys

    keys = QueueKeys.for_queue(queue)
    for band in keys.band_keys(b.decode() for b in client.smembers(keys.bands)):
        if client.xlen(band.stream) or client.xpending(band.stream, GROUP)["pending"]:
            return False
    return client.zcard(keys.delayed) == 0


def dlq_entries(client, queue: str) -> list[dict[str, bytes]]:
    """The dead-letter entries of ``queue``, oldest first, with text field names."""
    from chasqui_core.engine.store.keys import QueueKeys

    return [{k.decode(): v for k, v in fields.items()}
            for _, fields in client.xrange(QueueKeys.for_queue(queue).dlq)]


def dead_envelope(entry: dict[str, bytes]):
    """The job of a ``dlq_entries`` entry as the DLQ's readers see it (its last error's class and message are
    the entry's own fields)."""
    from chasqui_core.engine.dlq.entries import decode_entry

    return decode_entry("", "0-0", {k.encode(): v for k, v in entry.items()}).job


class Workers:
    """Starts worker processes for one test; ``close`` stops every one still alive."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = Path(log_dir)
        self.procs: list[subprocess.Popen] = []

    def start(self, queue: str | list[str], **options: object) -> subprocess.Popen:
        """Start one worker on a queue or several; ``options`` are the CLI flags (``visibility_ms=2000``; a list
        repeats its flag)."""
        argv = [sys.executable, str(SCRIPT), "--url", self.url]
        for name in [queue] if isinstance(queue, str) else queue:
            argv += ["--queue", name]
        for name, value in options.items():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                argv += [f"--{name.replace('_', '-')}", str(item)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115 - closed in stop()
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def wait_ready(self, client, queue: str, count: int, timeout: float = 20.0) -> None:
        """Wait until ``count`` workers of this test have registered on ``queue``."""
        from chasqui_core.engine.store.keys import QueueKeys

        key = QueueKeys.for_queue(queue).workers

        def registered() -> bool:
            for proc in self.procs:
                if proc.poll() is not None and proc.returncode != 0:
                    raise AssertionError(f"worker {proc.pid} exited with {proc.returncode}:\n{self.logs()}")
            return client.hlen(key) >= count

        wait_for(registered, timeout, f"{count} workers on {queue}")

    def bury(self, client, proc: subprocess.Popen, queue: str | list[str]) -> list[str]:
        """Record the death of a worker process that ended, as its supervisor does (recovery.record_death): the
        runs it had under way are then charged as deaths, not as lost contact. Returns its worker ids."""
        import socket

        from chasqui_core.engine.recovery.reclaim import record_death

        assert proc.poll() is not None, "only a process that ended is dead"
        return record_death(client, [queue] if isinstance(queue, str) else queue, host=socket.gethostname(),
                            pid=proc.pid, how=f"exit code {proc.returncode}")

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("worker-*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop every worker still alive, and print their logs (pytest shows them when a test fails)."""
        alive = [p for p in self.procs if p.poll() is None]
        for proc in alive:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in alive:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(self.logs())


if __name__ == "__main__":
    sys.exit(main())
