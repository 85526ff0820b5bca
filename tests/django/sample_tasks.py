"""Django Tasks used by the backend tests (imported by them, so they register)."""

from __future__ import annotations

import time

from django.tasks import task

from chasqui_core.engine.jobs.errors import UnrecoverableError

RUNS: list[tuple] = []


@task(queue_name="default")
def add(a: int, b: int) -> int:
    RUNS.append(("add", a, b))
    return a + b


@task(queue_name="default", takes_context=True, max_attempts=4, backoff=10)
def flaky(context, key: str, fail_times: int) -> int:
    attempt = context.attempt
    RUNS.append(("flaky", key, attempt))
    if attempt <= fail_times:
        raise RuntimeError(f"flaky {key} failed on attempt {attempt}")
    return attempt


@task(queue_name="default")
async def async_double(x: int) -> int:
    RUNS.append(("async_double", x))
    return x * 2


@task(queue_name="default", max_attempts=3, backoff=5)
def always_fails(key: str) -> None:
    RUNS.append(("always_fails", key))
    raise ValueError(f"always_fails {key}")


@task(queue_name="default", max_attempts=3, backoff=5)
async def async_fails_once(key: str) -> str:
    RUNS.append(("async_fails_once", key))
    if sum(1 for r in RUNS if r == ("async_fails_once", key)) == 1:
        raise RuntimeError(f"first run of {key} fails")
    return key


@task(queue_name="default", max_attempts=2, backoff=5)
async def async_always_fails(key: str) -> None:
    RUNS.append(("async_always_fails", key))
    raise LookupError(f"async_always_fails {key}")


@task(queue_name="default", max_attempts=5, backoff=60_000)
def fails_then_waits(key: str) -> None:
    RUNS.append(("fails_then_waits", key))
    raise RuntimeError(f"fails_then_waits {key}")


@task(queue_name="default", max_attempts=5)
def gives_up() -> None:
    RUNS.append(("gives_up",))
    raise UnrecoverableError("no point retrying")


@task(queue_name="default", takes_context=True)
def note_run(context, path: str) -> None:
    """Append this run's job id and process id to ``path`` (one line per run, from any worker process)."""
    import os

    with open(path, "a") as log:
        log.write(f"{context.task_result.id} {os.getpid()}\n")


@task(queue_name="default", takes_context=True, max_attempts=3, backoff=10)
async def reads_its_result(context, key: str) -> None:
    """Fails on its first run; on the second, records what its context's TaskResult says."""
    import time
    from datetime import UTC, datetime

    if context.attempt == 1:
        raise ValueError(f"first run of {key}")
    result = context.task_result
    RUNS.append(("reads_its_result", context.attempt, result.id, result.status, result.attempts,
                 [e.exception_class_path for e in result.errors], len(result.worker_ids), result.started_at,
                 datetime.fromtimestamp(time.time(), UTC), result is context.task_result))


@task(queue_name="default")
def counts_users() -> int:
    """Opens a database connection in the worker's thread and notes it, to see what happens to it after the job."""
    from django.contrib.auth.models import User
    from django.db import connections

    count = User.objects.count()
    RUNS.append(("counts_users", connections["default"]))
    return count


@task(queue_name="default", takes_context=True)
def patient(context, key: str, seconds: float = 30) -> str:
    """Works in steps, reporting its progress at each and stopping when it is cancelled."""
    RUNS.append(("patient", key))
    steps = int(seconds / 0.05)
    for step in range(steps):
        context.report_progress(step, f"step {step} of {steps}")
        context.check_cancelled()
        time.sleep(0.05)
    return "done"
