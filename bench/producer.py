"""Producer scenarios: how fast jobs get onto a queue, through the public APIs."""

from __future__ import annotations

import time

from chasqui_core.engine.queue import JobSpec, Queue

from .handlers import NOOP
from .results import RATE, Measurement


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
