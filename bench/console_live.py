"""The console's live figures: how soon a burst's first failure shows on the overview's Failed/s card.

A real engine worker (in a thread of this process) runs a task that always
fails; the console's sampler runs on this process's event loop with Channels'
in-memory layer, watching the overview as an open tab would, and this module
listens on the overview's group. Each burst adds failing jobs to a queue and
times from the add to the first overview fragment whose Failed/s card is no
longer ``0.0``: the worker's pickup, run and settle, the sampler's failure
watch, the reading and the rendering (the browser's part, a websocket frame
and an htmx swap, is not in it). Bursts are spaced so that the card is back
at ``0.0`` (the rate averages about ten seconds) before the next one.

It also counts the Redis commands the console sends per second while it
watches an idle overview (before the worker starts, so every command is the
console's), with the failure watch on and off, so its cost stays visible. The
watch costs one HMGET per known queue per look.

Run it alone with ``python -m bench.console_live`` (``--bursts N``,
``--interval S`` for ``CHASQUI_SAMPLER_INTERVAL``), or call ``measure``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import threading
import time

from .results import Measurement

SCENARIO = "console-live"
QUEUE = "bench-console-live"
FAILED_RATE = re.compile(r'data-metric="failed-rate">([^<]+)<')
QUIET_S = 11.5
"""Seconds for the Failed/s card to fall back to 0.0 after a burst (its rate averages the last ten)."""


def _setup_django(url: str, interval: float) -> None:
    os.environ["REDIS_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.django_settings")
    import django
    from django.conf import settings

    django.setup()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CHASQUI_SAMPLER_INTERVAL = interval
    from channels.layers import channel_layers

    channel_layers.backends.clear()


def _start_worker(url: str):
    from chasqui_core.engine.jobs.registry import HandlerRegistry
    from chasqui_core.engine.settle.retry import RetryPolicy
    from chasqui_core.engine.worker.worker import Worker

    def boom(n: int) -> None:
        raise ConnectionError(f"payment gateway timed out for order {n}")

    registry = HandlerRegistry()
    registry.register("boom", boom)
    worker = Worker(
        [QUEUE], registry, url=url, install_signal_handlers=False, concurrency=10, policy=RetryPolicy(max_attempts=1)
    )
    thread = threading.Thread(target=worker.run_sync, daemon=True, name="bench-console-live-worker")
    thread.start()
    return worker, thread


async def _fragments(layer, channel: str, marker: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            message = await asyncio.wait_for(layer.receive(channel), timeout=max(0.05, deadline - time.monotonic()))
        except TimeoutError:
            break
        html = message.get("html", "")
        if marker in html:
            yield html


async def _card(layer, channel: str, want_zero: bool, timeout: float) -> float | None:
    """Seconds until an overview fragment's Failed/s card is (or is no longer) 0.0; None on timeout."""
    started = time.monotonic()
    async for html in _fragments(layer, channel, 'id="ov-cards"', timeout):
        m = FAILED_RATE.search(html)
        if m and (m[1].strip() == "0.0") == want_zero:
            return time.monotonic() - started
    return None


def _commands(client) -> int:
    return sum(int(v["calls"]) for k, v in client.info("commandstats").items() if k.startswith("cmdstat_"))


async def _run(url: str, bursts: int, jobs: int) -> tuple[list[float], dict[str, float]]:
    from channels.layers import get_channel_layer

    from chasqui_core.engine.store.connection import connect
    from chasqui_core.engine.producer.queue import Queue
    from dashboard import sampler as sampler_mod
    from dashboard.topics import Topic

    client = connect(url)
    queue = Queue(QUEUE, redis_client=client)
    queue.add("boom", [0], delay=3_600_000)  # registers the queue without a run
    layer = get_channel_layer()
    channel = await layer.new_channel()
    topic = Topic("overview")
    await layer.group_add(topic.group, channel)
    sampler = sampler_mod.get_sampler()
    sampler.subscribe(topic)
    cost: dict[str, float] = {}
    latencies: list[float] = []
    worker = thread = None
    try:
        if await _card(layer, channel, want_zero=True, timeout=30) is None:
            raise RuntimeError("the overview never showed a Failed/s card at 0.0")
        # the console alone (no worker yet): every command counted is the sampler's
        for watch, name in ((sampler_mod.WATCH_INTERVAL, "watch on"), (3600.0, "watch off")):
            sampler_mod.WATCH_INTERVAL = watch
            await asyncio.sleep(1.0)
            before, t0 = _commands(client), time.monotonic()
            await asyncio.sleep(5.0)
            cost[name] = (_commands(client) - before) / (time.monotonic() - t0)
        sampler_mod.WATCH_INTERVAL = 0.2
        worker, thread = _start_worker(url)
        for n in range(bursts):
            if await _card(layer, channel, want_zero=True, timeout=QUIET_S * 2) is None:
                raise RuntimeError("the Failed/s card did not fall back to 0.0 between bursts")
            await asyncio.sleep(0.1 + (0.37 * n) % 1)  # land at different points of the tick and the second
            while True:  # drop what the tab already had
                try:
                    await asyncio.wait_for(layer.receive(channel), timeout=0.01)
                except TimeoutError:
                    break
            started = time.monotonic()
            for i in range(jobs):
                queue.add("boom", [n * jobs + i])
            seen = await _card(layer, channel, want_zero=False, timeout=30)
            if seen is None:
                raise RuntimeError("the burst's failures never reached the Failed/s card")
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(QUIET_S)
    finally:
        sampler_mod.WATCH_INTERVAL = 0.2
        sampler.unsubscribe(topic)
        await sampler.stop()
        if worker is not None and thread is not None:
            worker.request_stop()
            thread.join(30)
        client.close()
    return latencies, cost


def measure(url: str, *, bursts: int = 3, jobs: int = 20, interval: float = 1.0) -> list[Measurement]:
    """The first failure's way to the overview (ms, one sample per burst) and the console's Redis commands/s."""
    _setup_django(url, interval)
    logging.getLogger("chasqui.worker").setLevel(logging.ERROR)  # a line per failed job otherwise
    latencies, cost = asyncio.run(_run(url, bursts, jobs))
    note = f"sampler interval {interval:g} s, bursts of {jobs} failing jobs"
    out = [
        Measurement(
            SCENARIO,
            "first failure on the overview's Failed/s card",
            "ms",
            [round(s * 1000, 1) for s in latencies],
            jobs=jobs,
            note=note,
            lower_is_better=True,
        )
    ]
    for name, rate in cost.items():
        out.append(
            Measurement(
                SCENARIO,
                f"console Redis commands/s, idle overview, {name}",
                "cmd/s",
                [round(rate, 1)],
                lower_is_better=True,
                note=note,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_live", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20, help="failing jobs per burst")
    parser.add_argument("--interval", type=float, default=1.0, help="CHASQUI_SAMPLER_INTERVAL, seconds")
    args = parser.parse_args(argv)
    from .server import BenchServer

    with BenchServer() as server:
        for m in measure(server.url, bursts=args.bursts, jobs=args.jobs, interval=args.interval):
            print(f"{m.label}: {', '.join(f'{s:g}' for s in m.samples)} {m.unit} (median {m.median:g}; {m.note})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
