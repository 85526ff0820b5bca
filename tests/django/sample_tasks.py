"""Django Tasks used by the backend tests (imported by them, so they register)."""

from __future__ import annotations

from django.tasks import task

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
