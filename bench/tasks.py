"""The Django Tasks the Django-path scenarios enqueue and run (``bench`` is an app in bench.django_settings).

They do nothing, like the engine scenarios' handlers (bench/handlers.py), and
time their ``runworker`` process the same way: the first run writes the wall
clock and the process's CPU time to Redis, and the run that makes the
target-th success writes them again and wakes the bench. Two writes per
drain, on a connection opened at import, and a counter per run: the worker
is not slowed down. In a process the bench did not start for a drain (no
target in its environment) they write nothing.

Under ``runworker --processes N`` every worker process writes its own CPU
time (the fields are per pid) and no process sees the target alone: the
bench watches the queue instead. The processes start seconds apart (Django's
start-up), and the first one up would drain a good part of the backlog alone,
so each one's first run waits, holding its event loop, until all N have
started a job; the window opens then.
"""

from __future__ import annotations

import itertools
import os
import time

from django.tasks import task

from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.store.connection import connect

from .handlers import RETRY_BACKOFF_MS, FirstRunFails
from .machine import proc_cpu_seconds

QUEUE = "bench-django"
TARGET_ENV = "BENCH_RUNWORKER_TARGET"
"""How many successful runs close a ``runworker`` process's measured window."""
MARKS_KEY = "bench:runworker:marks"
"""Hash: ``first_wall`` and ``first_cpu:<pid>`` when a process's first run started, ``last_wall`` and
``last_cpu:<pid>`` when the target-th run succeeded."""
DONE_KEY = "bench:runworker:done"
"""List pushed to when the target-th run succeeds, so the bench waits with BLPOP instead of polling."""
PROCESSES_ENV = "BENCH_RUNWORKER_PROCESSES"
"""How many worker processes share the drain (``runworker --processes``)."""
ARRIVED_KEY = "bench:runworker:arrived"
GO_KEY = "bench:runworker:go"
BARRIER_TIMEOUT = 120
"""Seconds a process waits for the others to start a job before it goes on alone."""

_target = int(os.environ.get(TARGET_ENV) or 0)
_processes = int(os.environ.get(PROCESSES_ENV) or 1)
_runs = itertools.count()  # next() on a count is atomic: safe from the sync lane's threads
_successes = itertools.count(1)
_client = None
if _target:
    _client = connect(chasqui_settings().redis_url)
    _client.ping()  # connect now, not inside the measured window


def _wait_for_every_process() -> None:
    """Block until every worker process of the drain has started a job (an async task holds its whole process)."""
    if _client.incr(ARRIVED_KEY) == _processes:
        _client.lpush(GO_KEY, *[1] * (_processes - 1))
    else:
        _client.blpop([GO_KEY], timeout=BARRIER_TIMEOUT)


def _started() -> None:
    if next(_runs) == 0 and _target:
        if _processes > 1:
            _wait_for_every_process()
        pipe = _client.pipeline(transaction=False)
        pipe.hsetnx(MARKS_KEY, "first_wall", repr(time.time()))  # the first process to start a job sets it
        # with several processes the end is read from /proc by the bench, in clock ticks: start in the same unit
        cpu = proc_cpu_seconds(os.getpid()) if _processes > 1 else time.process_time()
        pipe.hset(MARKS_KEY, f"first_cpu:{os.getpid()}", repr(cpu))
        pipe.execute()


def _succeeded() -> None:
    if next(_successes) == _target:
        pipe = _client.pipeline(transaction=False)
        pipe.hset(MARKS_KEY, mapping={"last_wall": repr(time.time()),
                                      f"last_cpu:{os.getpid()}": repr(time.process_time())})
        pipe.lpush(DONE_KEY, 1)
        pipe.execute()


@task(queue_name=QUEUE)
def noop(i: int) -> None:
    """A plain ``def`` that does nothing: ``django-enqueue``, ``django-enqueue-many`` and ``runworker-sync``."""
    _started()
    _succeeded()


@task(queue_name=QUEUE)
async def anoop(i: int) -> None:
    """The ``async def`` twin: ``runworker-async``."""
    _started()
    _succeeded()


@task(queue_name=QUEUE, takes_context=True, max_attempts=3, backoff=RETRY_BACKOFF_MS)
async def fail_once(context, i: int) -> None:
    """Fails on its first run, succeeds on its second (1 ms later): ``runworker-retry``.

    The Django way of knowing the attempt is the task context.
    """
    _started()
    if context.attempt == 1:
        raise FirstRunFails(f"job {i} fails on its first run, on purpose")
    _succeeded()
