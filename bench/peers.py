"""Peers: RQ and arq on the same server, in the same run, as ratios.

Each is measured like ``worker-concurrent`` (a worker process draining a
preloaded backlog of noop jobs, from the first handler start to the end of
the drain) and like ``queue-add-bulk`` (its fastest way to add many jobs).
Settings lean in the peers' favour: results are not kept, per-job logging
is off, arq polls every 10 ms instead of every 500 ms. They are optional
packages (requirements-bench.txt); when missing, the scenario says so and
moves on.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import redis

from .child import Child
from .results import RATE, BenchError, Measurement

INSTALL = "pip install --no-deps -r requirements-bench.txt"
QUEUE = "bench"
ARQ_MAX_JOBS = 100
ARQ_POLL_DELAY = 0.01
ARQ_ENQUEUE_CONCURRENCY = 100
BULK_CHUNK = 1000


def _skipped(system: str) -> list[Measurement]:
    return [Measurement(name, name, RATE, system=system, skipped=f"skipped: {INSTALL}")
            for name in ("queue-add-bulk", "worker-concurrent")]


def run(ctx) -> list[Measurement]:
    out: list[Measurement] = []
    for system, measure in (("rq", _rq), ("arq", _arq)):
        if importlib.util.find_spec(system) is None:
            ctx.say(f"   {system} is not installed: skipped ({INSTALL})")
            out += _skipped(system)
        else:
            out += measure(ctx)
    return out


def _drains(ctx, program: str, n: int, preload, count_left) -> list[float]:
    rates = []
    with Child(program, {"url": ctx.url}) as child:
        for i, size in enumerate([ctx.warmup_size(n)] + [n] * ctx.repeats):
            ctx.flush()
            preload(size)
            reply = child.request({"n": size}, timeout=max(300.0, size / 20))
            left = count_left()
            if reply["jobs"] != size or left:
                raise BenchError(f"{program}: {reply['jobs']} of {size} jobs ran and {left} are still queued")
            if i:
                rates.append(reply["jobs"] / reply["seconds"])
    return rates


# --- RQ --------------------------------------------------------------------------------------


def _rq_add_bulk(conn: redis.Redis, n: int) -> None:
    from rq import Queue

    from .peer_tasks import rq_noop

    q = Queue(QUEUE, connection=conn)
    for start in range(0, n, BULK_CHUNK):
        with conn.pipeline() as pipe:
            q.enqueue_many([Queue.prepare_data(rq_noop, (i,), result_ttl=0)
                            for i in range(start, min(n, start + BULK_CHUNK))], pipeline=pipe)
            pipe.execute()


def _rq(ctx) -> list[Measurement]:
    from rq import Queue

    conn = redis.Redis.from_url(ctx.url)

    def bulk_once(n: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        _rq_add_bulk(conn, n)
        return n, time.perf_counter() - t0

    n_bulk = ctx.size(20_000, 500)
    n_work = ctx.size(2_000, 200)
    bulk = ctx.rates(bulk_once, n_bulk)
    work = _drains(ctx, "rq-drain", n_work, lambda size: _rq_add_bulk(conn, size),
                   lambda: Queue(QUEUE, connection=conn).count)
    conn.close()
    return [
        Measurement("queue-add-bulk", "queue-add-bulk", RATE, bulk, system="rq", jobs=n_bulk,
                    note=f"RQ Queue.enqueue_many in pipelines of {BULK_CHUNK}, result_ttl=0"),
        Measurement("worker-concurrent", "worker-concurrent", RATE, work, system="rq", jobs=n_work,
                    note="RQ SimpleWorker, burst mode, logging at WARNING; RQ runs one job at a time per worker"),
    ]


def serve_rq(config: dict, channel) -> None:
    """Child program: for each ``{"n": N}``, an RQ SimpleWorker drains the queue in burst mode."""
    from rq import Queue, SimpleWorker

    from . import peer_tasks

    conn = redis.Redis.from_url(config["url"])
    while True:
        message = channel.receive()
        if message.get("cmd") == "quit":
            return
        peer_tasks.reset()
        worker = SimpleWorker([Queue(QUEUE, connection=conn)], connection=conn)
        worker.work(burst=True, logging_level="WARNING")
        end = time.perf_counter()
        channel.send({"jobs": peer_tasks.runs, "seconds": end - (peer_tasks.first or end)})


# --- arq -------------------------------------------------------------------------------------


async def _arq_add_bulk(url: str, n: int) -> float:
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(url))
    try:
        t0 = time.perf_counter()
        for start in range(0, n, ARQ_ENQUEUE_CONCURRENCY):
            await asyncio.gather(*(pool.enqueue_job("arq_noop", i)
                                   for i in range(start, min(n, start + ARQ_ENQUEUE_CONCURRENCY))))
        return time.perf_counter() - t0
    finally:
        await pool.aclose()


def _arq(ctx) -> list[Measurement]:
    from arq.constants import default_queue_name

    def bulk_once(n: int) -> tuple[int, float]:
        return n, asyncio.run(_arq_add_bulk(ctx.url, n))

    n_bulk = ctx.size(10_000, 500)
    n_work = ctx.size(10_000, 200)
    bulk = ctx.rates(bulk_once, n_bulk)
    work = _drains(ctx, "arq-drain", n_work, lambda size: asyncio.run(_arq_add_bulk(ctx.url, size)),
                   lambda: ctx.client.zcard(default_queue_name))
    return [
        Measurement("queue-add-bulk", "queue-add-bulk", RATE, bulk, system="arq", jobs=n_bulk,
                    note=f"arq has no bulk add: enqueue_job, {ARQ_ENQUEUE_CONCURRENCY} at a time (asyncio.gather)"),
        Measurement("worker-concurrent", "worker-concurrent", RATE, work, system="arq", jobs=n_work,
                    note=f"arq Worker, burst mode, max_jobs={ARQ_MAX_JOBS}, poll_delay={ARQ_POLL_DELAY * 1000:.0f} ms, "
                         "keep_result=0"),
    ]


def serve_arq(config: dict, channel) -> None:
    """Child program: for each ``{"n": N}``, an arq Worker drains the queue in burst mode."""
    from . import peer_tasks

    async def drain() -> float:
        from arq.connections import RedisSettings
        from arq.worker import Worker, func

        worker = Worker(functions=[func(peer_tasks.arq_noop, name="arq_noop")],
                        redis_settings=RedisSettings.from_dsn(config["url"]), burst=True, max_jobs=ARQ_MAX_JOBS,
                        poll_delay=ARQ_POLL_DELAY, keep_result=0, handle_signals=False)
        try:
            await worker.main()
            return time.perf_counter()
        finally:
            await worker.close()

    while True:
        message = channel.receive()
        if message.get("cmd") == "quit":
            return
        peer_tasks.reset()
        end = asyncio.run(drain())
        channel.send({"jobs": peer_tasks.runs, "seconds": end - (peer_tasks.first or end)})
