"""The promoter scenario: how fast due jobs move from the delayed set to the stream.

The delayed set is filled with N jobs that are all due, then the engine's
real ``Promoter`` runs as the leader (its own ``run`` loop, lock included)
until it has moved every one; the window is that drain. No worker reads the
stream meanwhile, so this is the promoter alone. The server's CPU time per
moved job is reported too: it varies far less than the rate on a shared
machine.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.timing.promoter import BATCH_SIZE, Promoter
from chasqui_core.engine.store.scripts import Scripts

from .handlers import NOOP
from .results import RATE, BenchError, Measurement
from .stats import median


def _server_cpu(client) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def _drain(url: str, keys: QueueKeys, n: int) -> float:
    client = aredis.Redis.from_url(url)
    promoter = Promoter(client, Scripts(client), keys, "bench-promoter")
    stop = asyncio.Event()

    async def watch() -> None:
        while promoter.moved_total < n:
            await asyncio.sleep(0.001)
        stop.set()

    t0 = time.perf_counter()
    await asyncio.gather(promoter.run(stop), watch())
    seconds = time.perf_counter() - t0
    await client.aclose()
    return seconds


def run(ctx) -> list[Measurement]:
    keys = QueueKeys.for_queue(ctx.queue)
    cpu_per_job: list[float] = []

    def once(n: int) -> tuple[int, float]:
        _fill(ctx.client, keys, n, time.time() * 1000 - 1000)
        cpu0 = _server_cpu(ctx.client)
        seconds = asyncio.run(_drain(ctx.url, keys, n))
        cpu_per_job.append((_server_cpu(ctx.client) - cpu0) / n * 1e6)
        if ctx.client.xlen(keys.stream) != n or ctx.client.zcard(keys.delayed) != 0:
            raise BenchError(f"promoter left {ctx.client.zcard(keys.delayed)} delayed and moved "
                             f"{ctx.client.xlen(keys.stream)} of {n}")
        return n, seconds

    n = ctx.size(200_000, 5_000)
    rates = ctx.rates(once, n)
    cpu = median(cpu_per_job[-len(rates):])
    return [Measurement("promoter", "promoter", RATE, rates, jobs=n,
                        note=f"delayed set preloaded with {n:,} due jobs, drained by the Promoter's run loop, "
                             f"batches of {BATCH_SIZE}; the server used {cpu:.2f} µs of CPU per moved job (median)")]


def _fill(client, keys: QueueKeys, n: int, due_ms: float) -> None:
    """n due jobs straight into the delayed set (the fill is not what is measured)."""
    from chasqui_core.engine.jobs.envelope import new_job_id, pack_job

    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 5000):
        pipe.zadd(keys.delayed, {pack_job(new_job_id(), NOOP, [i], {}, 0, None, None, 0, {}): due_ms
                                 for i in range(start, min(n, start + 5000))})
        pipe.execute()
