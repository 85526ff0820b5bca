"""The Django Tasks the Django-path scenarios enqueue and run (``bench`` is an app in bench.django_settings).

Each marks the server time its first job started (job 0, the head of the
backlog) so the scenario can time a real ``manage.py runworker`` process from
its first job to its last, not from the start of the process. Only job 0 pays
for the mark.
"""

from __future__ import annotations

import os

import redis
from django.tasks import task

QUEUE = "bench-django"
FIRST_KEY = "bench:django:first-job-ms"

_client: redis.Redis | None = None


def _mark_first() -> None:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["REDIS_URL"])
    seconds, micros = _client.time()
    _client.set(FIRST_KEY, seconds * 1000 + micros // 1000, nx=True)


@task(queue_name=QUEUE)
def noop(i: int) -> None:
    """Does nothing: the enqueue scenarios measure what enqueueing costs."""
    if i == 0:
        _mark_first()


@task(queue_name=QUEUE)
async def anoop(i: int) -> None:
    if i == 0:
        _mark_first()


@task(queue_name=QUEUE, takes_context=True, max_attempts=3, backoff=1)
async def fail_once(context, i: int) -> None:
    """Fails on its first run, succeeds on its second: the Django way of knowing the attempt is the context."""
    if context.attempt == 1:
        if i == 0:
            _mark_first()
        raise RuntimeError(f"job {i} fails once")
