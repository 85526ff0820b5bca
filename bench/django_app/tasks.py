"""The Django Tasks the Django-path scenarios enqueue and run.

They do nothing, like the engine scenarios' handlers (bench/handlers.py), and
time their ``runworker`` process the same way: the first run writes the wall
clock and the process's CPU time to Redis, and the run that makes the
target-th success writes them again and wakes the bench. Two writes per
drain, on a connection opened at import, and a counter per run: the worker
is not slowed down. In a process the bench did not start for a drain (no
target in its environment) they write nothing.
"""

from __future__ import annotations

import itertools
import os
import time

from django.tasks import task

from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.connection import connect

from ..handlers import RETRY_BACKOFF_MS, FirstRunFails
from . import DONE_KEY, MARKS_KEY, QUEUE, TARGET_ENV

_target = int(os.environ.get(TARGET_ENV) or 0)
_runs = itertools.count()  # next() on a count is atomic: safe from the sync lane's threads
_successes = itertools.count(1)
_client = None
if _target:
    _client = connect(chasqui_settings().redis_url)
    _client.ping()  # connect now, not inside the measured window


def _mark(moment: str, done: bool = False) -> None:
    pipe = _client.pipeline(transaction=False)
    pipe.hset(MARKS_KEY, mapping={f"{moment}_wall": repr(time.time()), f"{moment}_cpu": repr(time.process_time())})
    if done:
        pipe.lpush(DONE_KEY, 1)
    pipe.execute()


def _started() -> None:
    if next(_runs) == 0 and _target:
        _mark("first")


def _succeeded() -> None:
    if next(_successes) == _target:
        _mark("last", done=True)


@task(queue_name=QUEUE)
async def noop(i: int) -> None:
    """Async, does nothing: ``django-enqueue``, ``django-enqueue-many`` and ``runworker-async``."""
    _started()
    _succeeded()


@task(queue_name=QUEUE)
def noop_sync(i: int) -> None:
    """A plain ``def``, run in the worker's threads: ``runworker-sync``."""
    _started()
    _succeeded()


@task(queue_name=QUEUE, takes_context=True, max_attempts=3, backoff=RETRY_BACKOFF_MS)
async def fail_once(context, i: int) -> None:
    """Fails on its first attempt, succeeds on the second (retried after 1 ms): ``runworker-retry``."""
    _started()
    if context.attempt == 1:
        raise FirstRunFails("the first run of every job fails on purpose")
    _succeeded()
