"""Worker scenarios: how fast one worker process drains a preloaded backlog.

The backlog is loaded first, with the worker not yet running; the window
opens when the first handler starts and closes when the n-th job's outcome
is acknowledged in Redis (the settler has flushed it), so the rate is
n / seconds of a complete drain. The worker is the engine's real ``Worker``
with everything users rely on switched on: retries, events and counters,
heartbeats, lease renewal, crash recovery, the promoter. It is stopped
cleanly after each run and the database is checked for leftovers.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, UTC

from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue

from .child import Child
from .handlers import TASK_OF
from .results import RATE, BenchError, Measurement
from .stats import median


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    handler: str
    concurrency: int
    full: int
    smoke: int
    delayed: bool = False
    note: str = ""
    beside: str = ""
    """A setup whose drains take turns with this one's in the same worker process, reported as a row of its own
    (see ``beside``): a ratio between rows measured minutes apart means little on a shared machine."""


SETUPS = {
    "worker-generic": WorkerSetup("noop_async", 1, 20_000, 500, note="concurrency 1, async noop handler"),
    "worker-concurrent": WorkerSetup("noop_async", 100, 100_000, 2_000, note="concurrency 100, async noop handler"),
    "worker-sync": WorkerSetup("noop_sync", 10, 50_000, 1_000,
                               note="concurrency 10 (threads), sync def noop handler"),
    "worker-retry": WorkerSetup("fail_once", 100, 50_000, 1_000,
                                note="concurrency 100; every job fails once, retried after 1 ms, then succeeds; "
                                     "successes per second", beside="worker-concurrent"),
    "worker-delayed-e2e": WorkerSetup("noop_async", 100, 100_000, 2_000, delayed=True,
                                      note="concurrency 100; backlog preloaded in the delayed set, all due: "
                                           "promoted and consumed", beside="worker-concurrent"),
}


def preload(q: Queue, n: int, handler: str, delayed: bool = False) -> None:
    task = TASK_OF[handler]
    if delayed:
        due = datetime.now(UTC) - timedelta(seconds=1)
        q.add_bulk(JobSpec(task, [i], run_at=due) for i in range(n))
    else:
        q.add_bulk(JobSpec(task, [i]) for i in range(n))


def check_settled(client, queue: str, n: int) -> None:
    """Every job must be gone from the stream, the pending list, the delayed set and the DLQ."""
    keys = QueueKeys.for_queue(queue)
    left = client.xlen(keys.stream)
    pending = client.xpending(keys.stream, GROUP)["pending"] if client.exists(keys.stream) else 0
    delayed = client.zcard(keys.delayed)
    dead = client.xlen(keys.dlq)
    if left or pending or delayed or dead:
        raise BenchError(
            f"after draining {n} jobs the queue still holds {left} stream entries ({pending} pending), "
            f"{delayed} delayed and {dead} dead jobs: the measurement does not cover the whole drain"
        )


def drains(ctx, setups: list[WorkerSetup], n: int) -> list[list[dict]]:
    """Run one worker process through a warm-up drain and ``ctx.repeats`` measured drains of ``n`` jobs per setup.

    With more than one setup (they share a concurrency), each round drains
    one backlog of each, in turns, the first setup going first in every
    other round: what the host was doing meanwhile weighs on all of them alike.
    """
    if len({s.concurrency for s in setups}) != 1:
        raise BenchError("setups measured in turns must share a concurrency")
    sizes = [ctx.warmup_size(n)] + [n] * ctx.repeats
    replies: list[list[dict]] = [[] for _ in setups]
    with worker_process(ctx, setups[0]) as child:
        for i, size in enumerate(sizes):
            order = list(enumerate(setups))
            for position, setup in order if i % 2 == 0 else order[::-1]:
                reply = drain_in(ctx, child, setup, size)
                if i:  # the first round is the warm-up
                    replies[position].append(reply)
    return replies


def worker_process(ctx, setup: WorkerSetup) -> Child:
    """A worker process for ``setup``'s drains (its concurrency), waiting for ``drain_in`` requests."""
    return Child("drain", {"url": ctx.url, "queue": ctx.queue, "concurrency": setup.concurrency})


def drain_in(ctx, child: Child, setup: WorkerSetup, size: int) -> dict:
    """Empty the database, preload ``size`` jobs of ``setup``, have ``child`` drain them; its reply."""
    ctx.flush()
    preload(Queue(ctx.queue, redis_client=ctx.client), size, setup.handler, setup.delayed)
    reply = child.request({"n": size}, timeout=max(120.0, size / 100))
    check_settled(ctx.client, ctx.queue, size)
    return reply


def run_setup(ctx, name: str) -> list[Measurement]:
    setup = SETUPS[name]
    n = ctx.size(setup.full, setup.smoke)
    if not setup.beside:
        return [measurement(name, name, setup, drains(ctx, [setup], n)[0], n)]
    other = SETUPS[setup.beside]
    own, theirs = drains(ctx, [setup, other], n)
    return [measurement(name, name, setup, own, n),
            measurement(name, beside(name), other, theirs, n, f"; taking turns with {name} in the same process")]


def beside(name: str) -> str:
    """The label of the row measured in turns with scenario ``name``."""
    return f"{SETUPS[name].beside} (beside {name})"


def measurement(scenario: str, label: str, setup: WorkerSetup, replies: list[dict], n: int,
                more: str = "") -> Measurement:
    cpu_us = median([r["cpu_seconds"] / r["jobs"] * 1e6 for r in replies])
    note = f"{setup.note}{more}; the worker process used {cpu_us:.1f} µs of CPU per job (median)"
    return Measurement(scenario, label, RATE, [r["jobs"] / r["seconds"] for r in replies], jobs=n, note=note,
                       cpu_us_per_job=cpu_us)


# --- the worker process ----------------------------------------------------------------------


def worker_for(config: dict, registry):
    from chasqui_core.engine.settle.retry import RetryPolicy
    from chasqui_core.engine.worker.worker import Worker

    queues = config.get("queues") or [config["queue"]]
    return Worker(queues, registry, url=config["url"], concurrency=config["concurrency"],
                  policy=RetryPolicy(max_attempts=3), install_signal_handlers=False, shutdown_timeout=30)


async def drain_once(config: dict, n: int) -> dict:
    from .handlers import Recorder, build_registry

    loop = asyncio.get_running_loop()
    recorder = Recorder(n, loop)
    worker = worker_for(config, build_registry(recorder))
    running = asyncio.create_task(worker.run(), name="worker")
    done = asyncio.create_task(recorder.done.wait())
    await asyncio.wait({running, done}, return_when=asyncio.FIRST_COMPLETED, timeout=max(600.0, n / 50))
    if not done.done():
        done.cancel()
        if running.done():
            running.result()  # raises what stopped the worker
            raise BenchError("the worker stopped before handling every job")
        worker.request_stop()
        await running
        raise BenchError(f"the worker handled only part of {n} jobs in time")
    while worker.stats.succeeded < n:  # a sync handler's outcome reaches the loop just after it returns
        await asyncio.sleep(0.0002)
    await worker.settler.drained()
    end = time.perf_counter()
    cpu = time.process_time() - recorder.first_cpu
    worker.request_stop()
    s0 = time.perf_counter()
    await running
    return {
        "jobs": n,
        "seconds": end - recorder.first,
        "cpu_seconds": cpu,
        "stop_seconds": time.perf_counter() - s0,
        "processed": worker.stats.processed,
        "failed": worker.stats.failed,
        "peak_rss_kb": peak_rss_kb(),
    }


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kb() -> int:
    """This process's peak resident size.

    ``ru_maxrss`` alone would do, but Linux carries it across ``execve``: a
    child started by a big parent would report the parent's size. ``VmHWM``
    is the high-water mark of this program's own memory, so it is used when
    the system has it.
    """
    hwm = _status_kb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _rss_kb() -> int:
    return _status_kb("VmRSS") or 0


def serve_drain(config: dict, channel) -> None:
    """Child program: for each ``{"n": N}``, run a fresh Worker until N jobs are settled."""
    if config.get("django"):
        import os

        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        django.setup()
    import chasqui_core.engine.worker.worker  # noqa: F401  (imports are not part of any measurement)

    rss_before = _rss_kb()
    while True:
        message = channel.receive()
        if message.get("cmd") == "quit":
            return
        reply = asyncio.run(drain_once(config, int(message["n"])))
        reply["rss_before_kb"] = rss_before
        channel.send(reply)
