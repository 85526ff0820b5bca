"""Latency: from enqueue to handler start, producer and worker in separate processes.

The producer (this process) stamps ``time.time_ns()`` into each job's
arguments right before adding it, at a steady rate; the worker process's
handler subtracts the stamp from its own clock when it starts. Two rates:
500 jobs/s, and half of saturation. Saturation is measured here, with the
same two processes: the producer adds as fast as it can for a few seconds,
and the rate at which the worker starts jobs during that window is the most
this pair can sustain on this machine (whichever of the two is slower sets
it). The worker's percentiles come back over the child's stdout.
"""

from __future__ import annotations

import asyncio
import threading
import time

from chasqui_core.engine.producer.queue import JobSpec, Queue

from .child import Child
from .handlers import STAMP
from .results import BenchError, Measurement
from .stats import percentile

LOW_RATE = 500
CONCURRENCY = 10
"""The engine's default concurrency: the worker most users run."""
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9))
PHASES = {"low": f"@ {LOW_RATE}/s", "half": "@ half of saturation"}


def label(p: str, phase: str | int) -> str:
    if phase == LOW_RATE:
        phase = "low"
    return f"latency {p} {PHASES[phase]}"


def produce(q: Queue, rate: float, count: int, tag: str) -> float:
    """Add ``count`` stamped jobs at ``rate`` per second; return the rate achieved."""
    add, add_bulk = q.add, q.add_bulk
    t0 = time.perf_counter()
    sent = 0
    while sent < count:
        elapsed = time.perf_counter() - t0
        due = min(count, int(elapsed * rate) + 1) - sent
        if due <= 0:
            time.sleep(max(0.0, sent / rate - elapsed))
            continue
        if due == 1:
            add(STAMP, [time.time_ns(), tag])
            sent += 1
        else:
            k = min(due, 1000)
            now = time.time_ns()
            add_bulk([JobSpec(STAMP, [now, tag]) for _ in range(k)])
            sent += k
    return count / (time.perf_counter() - t0)


def flood(q: Queue, seconds: float, tag: str, chunk: int = 100) -> tuple[int, int, int]:
    """Add stamped jobs as fast as possible for ``seconds``; return (jobs, start ns, end ns)."""
    add_bulk = q.add_bulk
    sent = 0
    start = time.time_ns()
    deadline = start + int(seconds * 1e9)
    while (now := time.time_ns()) < deadline:
        add_bulk([JobSpec(STAMP, [now, tag]) for _ in range(chunk)])
        sent += chunk
    return sent, start, time.time_ns()


def run(ctx) -> list[Measurement]:
    q = Queue(ctx.queue, redis_client=ctx.client)
    low_n = ctx.size(3_000, 100)
    warm_n = ctx.size(1_000, 50)
    ctx.flush()
    by_phase: dict[str, list[dict]] = {"low": [], "half": []}
    config = {"url": ctx.url, "queue": ctx.queue, "concurrency": CONCURRENCY}
    with Child("latency", config) as child:
        produce(q, LOW_RATE, warm_n, "warmup")
        child.request({"collect": "warmup", "expect": warm_n}, timeout=120)
        sent, start, end = flood(q, ctx.size(3.0, 0.5), "saturate")
        reply = child.request({"collect": "saturate", "expect": sent, "window": [start, end]},
                              timeout=120 + sent / 1000)
        saturation = reply["in_window"] / ((end - start) / 1e9)
        half = saturation / 2
        half_n = max(100, int(half * ctx.size(5.0, 0.2)))
        ctx.say(f"   saturation (producer adding flat out, worker concurrency {CONCURRENCY}): the worker started "
                f"{saturation:,.0f} jobs/s while the producer added {sent / ((end - start) / 1e9):,.0f} jobs/s; "
                f"half: {half:,.0f} jobs/s")
        for r in range(ctx.repeats):
            for phase, rate, count in (("low", LOW_RATE, low_n), ("half", half, half_n)):
                tag = f"{phase}{r}"
                achieved = produce(q, rate, count, tag)
                reply = child.request({"collect": tag, "expect": count}, timeout=60 + 3 * count / rate)
                reply["achieved"] = achieved
                by_phase[phase].append(reply)
    out = []
    for phase, count in (("low", low_n), ("half", half_n)):
        replies = by_phase[phase]
        rates = ", ".join(f"{r['achieved']:,.0f}" for r in replies)
        for p, _ in PERCENTILES:
            out.append(Measurement(
                "latency", label(p, phase), "ms", [r[p] / 1e6 for r in replies], jobs=count, lower_is_better=True,
                note=(f"{count:,} jobs per repeat at {LOW_RATE if phase == 'low' else half:,.0f} jobs/s asked "
                      f"(achieved {rates}); worker concurrency {CONCURRENCY}, async handler"
                      + ("" if phase == "low" else f"; saturation {saturation:,.0f} jobs/s")),
            ))
    return out


# --- the worker process ----------------------------------------------------------------


def serve(config: dict, channel) -> None:
    """Child program: one worker for the whole scenario; ``{"collect": tag, "expect": n}`` returns percentiles."""
    asyncio.run(_serve(config, channel))


async def _serve(config: dict, channel) -> None:
    from .consumer import worker_for
    from .handlers import Recorder, build_registry

    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        while True:
            message = channel.receive()
            loop.call_soon_threadsafe(commands.put_nowait, message)
            if message.get("cmd") == "quit":
                return

    threading.Thread(target=read, name="commands", daemon=True).start()
    samples: dict[str, list[tuple[int, int]]] = {}
    worker = worker_for(config, build_registry(Recorder(0, loop), samples))
    running = asyncio.create_task(worker.run(), name="worker")
    try:
        while True:
            get = asyncio.ensure_future(commands.get())
            await asyncio.wait({get, running}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                running.result()
                raise BenchError("the worker stopped by itself")
            message = get.result()
            if message.get("cmd") == "quit":
                return
            tag, expect = message["collect"], int(message["expect"])
            while len(samples.get(tag, ())) < expect:
                if running.done():
                    running.result()
                    raise BenchError("the worker stopped by itself")
                await asyncio.sleep(0.005)
            pairs = samples.pop(tag)
            got = sorted(started - stamp for stamp, started in pairs)
            reply = {p: percentile(got, q) for p, q in PERCENTILES}
            reply.update(n=len(got), max=got[-1])
            if "window" in message:
                lo, hi = message["window"]
                reply["in_window"] = sum(1 for _, started in pairs if lo <= started <= hi)
            channel.send(reply)
    finally:
        if not running.done():
            worker.request_stop()
            await running
