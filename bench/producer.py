"""Producer scenarios: how fast jobs get onto a queue, through the public APIs."""

from __future__ import annotations

import time

from chasqui_core.engine.keys import QueueKeys
from chasqui_core.engine.queue import JobSpec, Queue

from . import django_app
from .handlers import NOOP
from .results import RATE, BenchError, Measurement
from .stats import median


def queue_add(ctx) -> list[Measurement]:
    q = Queue(ctx.queue, redis_client=ctx.client)

    def once(n: int) -> tuple[int, float]:
        add = q.add
        t0 = time.perf_counter()
        for i in range(n):
            add(NOOP, [i])
        return n, time.perf_counter() - t0

    n = ctx.size(20_000, 500)
    return [Measurement("queue-add", "queue-add", RATE, ctx.rates(once, n), jobs=n,
                        note="Queue.add, one job per call, sync client")]


def queue_add_bulk(ctx) -> list[Measurement]:
    q = Queue(ctx.queue, redis_client=ctx.client)

    def once(n: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        q.add_bulk(JobSpec(NOOP, [i]) for i in range(n))
        return n, time.perf_counter() - t0

    n = ctx.size(200_000, 5_000)
    return [Measurement("queue-add-bulk", "queue-add-bulk", RATE, ctx.rates(once, n), jobs=n,
                        note=f"Queue.add_bulk, chunks of {q.chunk_size}, building the JobSpecs included")]


def queue_add_delayed(ctx) -> list[Measurement]:
    q = Queue(ctx.queue, redis_client=ctx.client)

    def once(n: int) -> tuple[int, float]:
        add = q.add
        t0 = time.perf_counter()
        for i in range(n):
            add(NOOP, [i], delay=60_000)
        return n, time.perf_counter() - t0

    n = ctx.size(20_000, 500)
    return [Measurement("queue-add-delayed", "queue-add-delayed", RATE, ctx.rates(once, n), jobs=n,
                        note="Queue.add(delay=60 s), one job per call")]


def _check_queued(ctx, queue: str, n: int) -> None:
    length = ctx.client.xlen(QueueKeys.for_queue(queue).stream)
    if length != n:
        raise BenchError(f"{n} jobs were enqueued but the stream holds {length}: the rate would not be true")


def django_enqueue(ctx) -> list[Measurement]:
    task = django_app.setup().noop
    enqueue = task.enqueue

    def once(n: int) -> tuple[int, float, float]:
        calls = []
        t0 = time.perf_counter()
        for i in range(n):
            c0 = time.perf_counter_ns()
            enqueue(i)
            calls.append(time.perf_counter_ns() - c0)
        seconds = time.perf_counter() - t0
        _check_queued(ctx, task.queue_name, n)
        return n, seconds, median(calls) / 1000

    n = ctx.size(20_000, 500)  # as queue-add, its engine twin
    runs = ctx.repeat(once, n)
    return [
        Measurement("django-enqueue", "django-enqueue", RATE, [jobs / s for jobs, s, _ in runs], jobs=n,
                    note=f"Django @task(...).enqueue(), one job per call ({task.module_path})"),
        Measurement("django-enqueue", "django-enqueue (one call, median)", "µs", [us for _, _, us in runs], jobs=n,
                    lower_is_better=True, note="time of a single enqueue() call"),
    ]


ENQUEUE_MANY_CALLS = 1000
"""Calls per ``enqueue_many()``, as many jobs as one ``add_bulk`` chunk of queue-add-bulk."""


def django_enqueue_many(ctx) -> list[Measurement]:
    task = django_app.setup().noop
    if not hasattr(task, "enqueue_many"):
        reason = "not available: this version's Django tasks have no enqueue_many()"
        ctx.say(f"   {reason}")
        return [Measurement("django-enqueue-many", "django-enqueue-many", RATE, skipped=reason)]
    enqueue_many = task.enqueue_many

    def once(n: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        for start in range(0, n, ENQUEUE_MANY_CALLS):
            enqueue_many([((i,), {}) for i in range(start, min(n, start + ENQUEUE_MANY_CALLS))])
        seconds = time.perf_counter() - t0
        _check_queued(ctx, task.queue_name, n)
        return n, seconds

    n = ctx.size(200_000, 5_000)  # as queue-add-bulk, its engine twin
    return [Measurement("django-enqueue-many", "django-enqueue-many", RATE, ctx.rates(once, n), jobs=n,
                        note=f"Django task.enqueue_many() of {ENQUEUE_MANY_CALLS} (args, kwargs) calls at a time, "
                             "building the list of calls included")]
