"""Producer scenarios: how fast jobs get onto a queue, through the public APIs."""

from __future__ import annotations

import time

import hiredis

from chasqui_core.engine.producer.link import Link
from chasqui_core.engine.producer.queue import JobSpec, Queue

from .handlers import NOOP
from .results import RATE, BenchError, Measurement
from .turns import taking_turns, turns_row


def queue_add(ctx) -> list[Measurement]:
    """Queue.add in a loop, and beside it, in turns, a bare round trip: one XADD of a job like Queue.add's, over
    the same kind of link.

    A single add cannot beat one round trip to the server that writes its
    job; the second row says what such a round trip costs on this machine at
    this moment, so that ``queue-add`` reads as a fraction of it rather than
    as a number whose meaning depends on the host (a loopback round trip took
    50 µs on one virtual machine, 170 µs on another).
    """
    q = Queue(ctx.queue, redis_client=ctx.client)
    add = q.add
    link = Link(ctx.client, connect_timeout=5.0)
    send, receive = link.send, link.receive
    xadd = hiredis.pack_command(("XADD", q.keys.stream + ":bare", "*", "j", q.build(JobSpec(NOOP, [0])).payload))

    def adds(start: int, stop: int) -> None:
        for i in range(start, stop):
            add(NOOP, [i])

    def xadds(start: int, stop: int) -> None:
        for _ in range(start, stop):
            send(xadd)
            receive(1)

    def check(n: int) -> None:
        length = ctx.client.xlen(q.keys.stream)
        if length != n:
            raise BenchError(f"{n} jobs were added but the stream holds {length}: the rate would not be true")
        ctx.client.delete(q.keys.stream + ":bare")

    n = ctx.size(20_000, 500)
    try:
        added, bare = taking_turns(ctx, n, BLOCK, adds, xadds, check)
    finally:
        link.close()
    return [
        turns_row("queue-add", "queue-add", added, n,
                  f"Queue.add, one job per call, sync client, in blocks of {BLOCK:,} calls taking turns with the "
                  "round trip row below", "call"),
        turns_row("queue-add", ROUND_TRIP, bare, n,
                  "a bare XADD of a job like Queue.add's, waiting for its reply, one at a time, on a connection like "
                  "Queue.add's: what one round trip that writes a job costs now", "round trip"),
    ]


ROUND_TRIP = "bare XADD round trip (beside queue-add)"
BLOCK = 1_000


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
