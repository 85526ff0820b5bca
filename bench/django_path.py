"""The path a Django user takes: ``@task`` + ``.enqueue()`` / ``.enqueue_many()`` + ``manage.py runworker``.

Each scenario has an engine twin (``queue-add``, ``queue-add-bulk``,
``worker-concurrent``, ``worker-sync``, ``worker-retry``) doing the same work
in the same run, with the same sizes, handler kind and concurrency, and the
report shows it as a fraction of that twin: what the Django layer costs.

The runworker scenarios start the real ``python manage.py runworker``, with
the bench's settings (bench/django_settings.py), on a preloaded backlog of
the bench's tasks (bench/tasks.py), a fresh process per drain. Django's
start-up is not throughput, so the window is not the process's life: it
opens when the first job starts (the task writes the time to Redis) and
closes when the bench sees the last job's outcome acknowledged in Redis
(woken by the task that made the target-th success, it polls every half
millisecond until the stream and the delayed set are empty; nothing polls
during the drain). The process is then stopped with SIGTERM and must exit
cleanly, and the queue is checked for leftovers, as for the twins.

``runworker-signed`` is the ``runworker-async`` drain with
``CHASQUI["SIGNING_KEYS"]`` set on both sides: the backlog is signed at
enqueue and the worker checks every job's signature before it runs it. It is
shown as a fraction of ``runworker-async`` of the same run: what signing
costs the worker.

``runworker-processes-2`` is the same drain by ``runworker --processes 2``: a
supervisor and two worker processes, compared with ``runworker-async`` of the
same run. The window opens once both processes have started a job (the
task holds each process's first run until then, bench/tasks.py). No process
sees the last success, so the bench reads the queue every few milliseconds
during the drain (a cheap XLEN and ZCARD), and the CPU per job is both
workers' CPU from their first job to the end of the window (read from
/proc; the idle supervisor is not counted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from chasqui_core.engine.ops import stats
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.jobs.signing import SIGNATURE

from . import consumer
from .child import ROOT, start_profiler, stop_profiler
from .machine import proc_cpu_seconds
from .results import RATE, BenchError, Measurement
from .stats import median
from .turns import taking_turns, turns_row

SETTINGS = "bench.django_settings"
ENQUEUE_MANY_CALLS = 1000
"""Calls per ``enqueue_many()``: as many jobs as one chunk of ``Queue.add_bulk``."""
START_TIMEOUT = 120.0
"""Seconds a fresh ``runworker`` may take to start its first job (Django start-up on a busy machine)."""
STOP_TIMEOUT = 60.0
"""Seconds a ``runworker`` process may take to exit after SIGTERM (its own shutdown timeout is 25 s)."""
SETTLE_POLL = 0.0005
DRAIN_POLL = 0.005
"""How often the bench reads the queue while several processes drain it (none of them can tell it is done)."""
SIGNING_KEY = "bench-signing-key-" + "k" * 32
SIGNING_KEYS_ENV = "CHASQUI_SIGNING_KEYS"
"""Read by the project's settings (config/settings.py), which bench.django_settings builds on."""


def _setup():
    """Django set up in this process with the bench's settings; the bench's tasks module."""
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS  # the bench's, whatever the shell exported
    import django

    django.setup()
    from . import tasks

    return tasks


def _check_queued(ctx, queue: str, n: int) -> None:
    length = ctx.client.xlen(QueueKeys.for_queue(queue).stream)
    if length != n:
        raise BenchError(f"{n} jobs were enqueued but the stream holds {length}: the rate would not be true")


def _queued(ctx, *queues: str) -> Callable[[int], None]:
    """A check for ``taking_turns``: each of ``queues`` holds the run's jobs."""
    def check(n: int) -> None:
        for queue in queues:
            _check_queued(ctx, queue, n)
    return check


# --- enqueue -----------------------------------------------------------------------------------


BLOCK = 1_000
"""Calls per block of ``django-enqueue``: Queue.add and task.enqueue() take turns, a block each."""


def django_enqueue(ctx) -> list[Measurement]:
    """task.enqueue() in a loop, and beside it, in the same run, the engine's Queue.add it wraps.

    The two loops take turns, a block of calls each, so that both see the
    same machine: on a shared host, single round-trip calls measured minutes
    apart differed by a quarter from one repeat to the next, more than the
    Django layer costs. The CPU each call takes in this process is kept too.
    """
    from chasqui_core.engine.producer.queue import Queue

    from .handlers import NOOP

    tasks = _setup()
    enqueue = tasks.noop.enqueue
    add = Queue(ctx.queue, redis_client=ctx.client).add
    ns = time.perf_counter_ns

    calls: list[list[int]] = []
    """The time of each enqueue() call, per run (the warm-up first)."""

    def enqueues(start: int, stop: int) -> None:
        if start == 0:
            calls.append([])
        run = calls[-1]
        for i in range(start, stop):
            n0 = ns()
            enqueue(i)
            run.append(ns() - n0)

    def adds(start: int, stop: int) -> None:
        for i in range(start, stop):
            add(NOOP, [i])

    n = ctx.size(20_000, 500)  # as queue-add
    enqueued, added = taking_turns(ctx, n, BLOCK, enqueues, adds, _queued(ctx, tasks.QUEUE, ctx.queue))
    return [
        turns_row("django-enqueue", "django-enqueue (loop)", enqueued, n,
                   f"Django @task(...).enqueue() {n:,} times ({tasks.noop.module_path}), in blocks of {BLOCK:,} "
                   "calls taking turns with the Queue.add row below", "call"),
        Measurement("django-enqueue", "django-enqueue (one call, median)", "µs",
                    [median(run) / 1000 for run in calls[1:]], jobs=n, lower_is_better=True,
                    note="time of a single enqueue() call"),
        turns_row("django-enqueue", QUEUE_ADD_BESIDE, added, n,
                   "Queue.add, one job per call, taking turns with task.enqueue() in the same run", "call"),
    ]

QUEUE_ADD_BESIDE = "queue-add (beside django-enqueue)"


def django_enqueue_many(ctx) -> list[Measurement]:
    """task.enqueue_many() of 1,000 calls at a time, taking turns with Queue.add_bulk of the same size.

    As with ``django-enqueue``, both see the same machine: on a shared host
    the two, run minutes apart, came out between 0.40 and 0.65 of each other.
    """
    from chasqui_core.engine.producer.queue import JobSpec, Queue

    from .handlers import NOOP

    tasks = _setup()
    if not hasattr(tasks.noop, "enqueue_many"):
        reason = "not available: this version's Django tasks have no enqueue_many()"
        ctx.say(f"   {reason}")
        return [Measurement("django-enqueue-many", "django-enqueue-many", RATE, skipped=reason)]
    enqueue_many = tasks.noop.enqueue_many
    add_bulk = Queue(ctx.queue, redis_client=ctx.client).add_bulk

    def many(start: int, stop: int) -> None:
        enqueue_many([((i,), {}) for i in range(start, stop)])

    def bulk(start: int, stop: int) -> None:
        add_bulk(JobSpec(NOOP, [i]) for i in range(start, stop))

    n = ctx.size(200_000, 5_000)  # as queue-add-bulk
    many_runs, bulk_runs = taking_turns(ctx, n, ENQUEUE_MANY_CALLS, many, bulk, _queued(ctx, tasks.QUEUE, ctx.queue))
    return [
        turns_row("django-enqueue-many", "django-enqueue-many", many_runs, n,
                   f"task.enqueue_many() of {ENQUEUE_MANY_CALLS:,} (args, kwargs) calls at a time, building the "
                   "calls included, taking turns with the Queue.add_bulk row below", "job"),
        turns_row("django-enqueue-many", QUEUE_ADD_BULK_BESIDE, bulk_runs, n,
                   f"Queue.add_bulk of {ENQUEUE_MANY_CALLS:,} JobSpecs at a time, building them included, taking "
                   "turns with task.enqueue_many() in the same run", "job"),
    ]

QUEUE_ADD_BULK_BESIDE = "queue-add-bulk (beside django-enqueue-many)"


# --- runworker -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunworkerSetup:
    task: str
    """The task in bench/tasks.py."""
    twin: str
    """The engine scenario it mirrors; its concurrency and backlog sizes are used."""
    note: str
    processes: int = 1
    """``runworker --processes``; above 1 a supervisor runs that many worker processes."""
    compared_with: str = ""
    """The row the report shows it against, when not its engine twin."""
    signed: bool = False
    """Jobs signed at enqueue and checked by the worker (``CHASQUI["SIGNING_KEYS"]`` on both sides)."""

    @property
    def concurrency(self) -> int:
        return consumer.SETUPS[self.twin].concurrency


SETUPS = {
    "runworker-async": RunworkerSetup("anoop", "worker-concurrent", "async def noop task, --concurrency 100"),
    "runworker-sync": RunworkerSetup("noop", "worker-sync", "def noop task, --concurrency 10 (threads)"),
    "runworker-sync-100": RunworkerSetup("noop", "worker-concurrent",
                                         "def noop task, --concurrency 100 (threads), against the engine's async "
                                         "drain: what a Django project of plain functions gets"),
    "runworker-retry": RunworkerSetup("fail_once", "worker-retry",
                                      "async task failing on its first run (1 ms backoff), then succeeding; "
                                      "--concurrency 100; successes per second"),
    "runworker-signed": RunworkerSetup("anoop", "worker-concurrent",
                                       "async def noop task, --concurrency 100, CHASQUI['SIGNING_KEYS'] set: every "
                                       "job signed at enqueue and its signature checked by the worker",
                                       compared_with="runworker-async", signed=True),
    "runworker-processes-2": RunworkerSetup("anoop", "worker-concurrent",
                                            "--processes 2: a supervisor and two worker processes, async def noop "
                                            "task, --concurrency 100 each", processes=2,
                                            compared_with="runworker-async"),
}


def _preload(ctx, task, n: int, *, signed: bool = False) -> None:
    """Enqueue the backlog, signed or not whatever the environment says (the setting is overridden meanwhile)."""
    from django.conf import settings
    from django.test.utils import override_settings

    with override_settings(CHASQUI={**settings.CHASQUI, "SIGNING_KEYS": [SIGNING_KEY] if signed else []}):
        for start in range(0, n, ENQUEUE_MANY_CALLS):
            task.enqueue_many([((i,), {}) for i in range(start, min(n, start + ENQUEUE_MANY_CALLS))])
    _check_queued(ctx, task.queue_name, n)
    [(_, fields)] = ctx.client.xrange(QueueKeys.for_queue(task.queue_name).stream, count=1)
    if (SIGNATURE in decode(fields[b"j"]).meta) != signed:
        raise BenchError(f"the backlog should {'' if signed else 'not '}be signed, and is "
                         f"{'not ' if signed else ''}: the rate would not be true")


class RunworkerProcess:
    """``python manage.py runworker`` on the bench's settings, output to a file; always stopped on exit."""

    def __init__(self, name: str, queue: str, concurrency: int, target: int, processes: int = 1,
                 signed: bool = False) -> None:
        from .tasks import PROCESSES_ENV, TARGET_ENV

        env = dict(os.environ)
        env.pop(SIGNING_KEYS_ENV, None)
        if signed:
            env[SIGNING_KEYS_ENV] = SIGNING_KEY
        env[PROCESSES_ENV] = str(processes)
        env["DJANGO_SETTINGS_MODULE"] = SETTINGS
        env[TARGET_ENV] = str(target)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        # not a pipe: a worker printing more than a pipe holds would block; closed by stop()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", queue, "--concurrency", str(concurrency),
             "--processes", str(processes)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
        )
        # A supervisor runs no job: sampling it would show nothing worth a profile.
        self._profiler = start_profiler(self.proc.pid, name) if processes == 1 else None

    def __enter__(self) -> RunworkerProcess:
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


def _wait_done(ctx, worker: RunworkerProcess, timeout: float) -> None:
    """Block until the task that makes the target-th success says so (or the process dies)."""
    from .tasks import DONE_KEY, MARKS_KEY

    deadline = time.monotonic() + timeout
    while not ctx.client.blpop([DONE_KEY], timeout=1):
        error = worker.exited()
        if error is not None:
            raise error
        if time.monotonic() > deadline:
            started = ctx.client.hexists(MARKS_KEY, "first_wall")
            raise BenchError(f"runworker did not finish its drain within {timeout:.0f} s "
                             f"({'it started jobs' if started else 'no job started'}); its last lines:\n"
                             f"{worker.output()}")


def _wait_settled(ctx, queue: str, *, poll: float = SETTLE_POLL, worker: RunworkerProcess | None = None,
                  timeout: float | None = None) -> float:
    """The wall-clock time at which the stream and the delayed set are empty: every outcome acknowledged."""
    keys = QueueKeys.for_queue(queue)
    pipe = ctx.client.pipeline(transaction=False)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pipe.xlen(keys.stream)
        pipe.zcard(keys.delayed)
        left, delayed = pipe.execute()
        if not left and not delayed:
            return time.time()
        error = worker.exited() if worker is not None else None
        if error is not None:
            raise error
        if deadline is not None and time.monotonic() > deadline:
            raise BenchError(f"runworker did not drain {queue} within {timeout:.0f} s ({left} entries left); "
                             f"its last lines:\n{worker.output() if worker else ''}")
        time.sleep(poll)


def _children_cpu(ctx, queue: str, supervisor_pid: int) -> dict[int, float]:
    """CPU time so far of each worker process of ``supervisor_pid``, found by their heartbeats."""
    pids = [w.pid for w in stats.workers(ctx.client, queue) if w.supervisor_pid == supervisor_pid]
    if not pids:
        raise BenchError(f"no worker process of supervisor {supervisor_pid} has a heartbeat on {queue}")
    return {pid: proc_cpu_seconds(pid) for pid in pids}


def _drain(ctx, name: str, setup: RunworkerSetup, task, n: int) -> dict:
    """One fresh ``runworker`` drains ``n`` preloaded jobs; the jobs, seconds and CPU of its window."""
    from .tasks import MARKS_KEY

    ctx.flush()
    _preload(ctx, task, n, signed=setup.signed)
    started = time.time()
    timeout = START_TIMEOUT + max(120.0, n / 100)
    with RunworkerProcess(name, task.queue_name, setup.concurrency, target=n, processes=setup.processes,
                          signed=setup.signed) as worker:
        if setup.processes == 1:
            _wait_done(ctx, worker, timeout=timeout)
            end = _wait_settled(ctx, task.queue_name)
        else:
            end = _wait_settled(ctx, task.queue_name, poll=DRAIN_POLL, worker=worker, timeout=timeout)
            cpu_at_end = _children_cpu(ctx, task.queue_name, worker.proc.pid)
    consumer.check_settled(ctx.client, task.queue_name, n)
    marks = {k.decode(): float(v) for k, v in ctx.client.hgetall(MARKS_KEY).items()}
    first_cpu = {int(k.split(":")[1]): v for k, v in marks.items() if k.startswith("first_cpu:")}
    if setup.processes == 1:
        last_cpu = {int(k.split(":")[1]): v for k, v in marks.items() if k.startswith("last_cpu:")}
    else:
        last_cpu = cpu_at_end
    cpu = sum(last_cpu[pid] - first for pid, first in first_cpu.items() if pid in last_cpu)
    return {"jobs": n, "seconds": end - marks["first_wall"], "cpu_seconds": cpu,
            "startup_seconds": marks["first_wall"] - started, "processes_with_jobs": len(first_cpu)}


def runworker(ctx, name: str) -> list[Measurement]:
    setup = SETUPS[name]
    task = getattr(_setup(), setup.task)
    twin = consumer.SETUPS[setup.twin]
    n = ctx.size(twin.full, twin.smoke)
    # Every drain is a fresh process, so a warm-up warms only the server and the machine: worth it for a
    # measured run, not for a smoke run, whose numbers mean little anyway.
    sizes = ([] if ctx.smoke else [ctx.warmup_size(n)]) + [n] * ctx.repeats
    if setup.compared_with:
        replies = [_drain(ctx, name, setup, task, size) for size in sizes][-ctx.repeats:]
        engine_rows = []
    else:
        replies, theirs = _in_turns(ctx, name, setup, task, sizes)
        engine_rows = [consumer.measurement(name, beside(name), twin, theirs, n,
                                            f"; taking turns with {name}, drain by drain")]
    cpu_us = median([r["cpu_seconds"] / r["jobs"] * 1e6 for r in replies])
    startup = median([r["startup_seconds"] for r in replies])
    if setup.processes == 1:
        note = (f"python manage.py runworker {task.queue_name}, {setup.note}; a fresh process per drain, timed from "
                f"its first job's start to its last job's outcome in Redis (start-up to the first job, not counted: "
                f"{startup:.1f} s); the worker process used {cpu_us:.1f} µs of CPU per job (median)")
    else:
        busy = min(r["processes_with_jobs"] for r in replies)
        note = (f"python manage.py runworker {task.queue_name} {setup.note}; fresh processes per drain, timed from "
                f"the moment both had started a job to the last job's outcome in Redis (start-up until then, not "
                f"counted: {startup:.1f} s); the worker processes used {cpu_us:.1f} µs of CPU per job "
                f"together (median); {busy} of {setup.processes} processes ran jobs in every drain")
    return [Measurement(name, name, RATE, [r["jobs"] / r["seconds"] for r in replies], jobs=n, note=note,
                        cpu_us_per_job=cpu_us), *engine_rows]


def _in_turns(ctx, name: str, setup: RunworkerSetup, task, sizes: list[int]) -> tuple[list[dict], list[dict]]:
    """Drains of a fresh ``runworker`` taking turns with drains of its engine twin in one engine worker process.

    Each round drains one backlog of each, the runworker first in every other
    round, so that the ratio of the two compares drains that saw the same
    machine; rows measured minutes apart on a shared host moved by a third.
    The measured rounds' replies of each, the warm-up round's left out.
    """
    twin = consumer.SETUPS[setup.twin]
    own: list[dict] = []
    theirs: list[dict] = []
    with consumer.worker_process(ctx, twin) as engine:
        for i, size in enumerate(sizes):
            for runworker_turn in (True, False) if i % 2 == 0 else (False, True):
                if runworker_turn:
                    own.append(_drain(ctx, name, setup, task, size))
                else:
                    theirs.append(consumer.drain_in(ctx, engine, twin, size))
    return own[-ctx.repeats:], theirs[-ctx.repeats:]


def beside(name: str) -> str:
    """The label of the engine row measured in turns with runworker scenario ``name``."""
    return f"{SETUPS[name].twin} (beside {name})"
