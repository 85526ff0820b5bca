"""Memory: the peak resident size of a worker process draining a backlog.

Each repeat starts a fresh process, so its peak belongs to that drain alone.
The peak is ``VmHWM``, the high-water mark of the process's own memory:
Linux carries ``ru_maxrss`` over from the parent across ``execve``, so a
child of a big parent would report the parent's size. The backlog is loaded
by this process before the worker starts. There is no warm-up: a fresh
process is the point. Measured twice: the engine's worker alone, and with
Django set up as ``runworker`` has it.
"""

from __future__ import annotations

from chasqui_core.engine.producer.queue import Queue

from .child import Child
from .consumer import check_settled, preload
from .results import Measurement

LABEL = "memory: peak RSS of a worker"
LABEL_DJANGO = "memory: peak RSS, Django loaded"
CONCURRENCY = 100


def run(ctx) -> list[Measurement]:
    q = Queue(ctx.queue, redis_client=ctx.client)
    n = ctx.size(100_000, 2_000)
    out = []
    for label, django in ((LABEL, False), (LABEL_DJANGO, True)):
        peaks, before = [], []
        for _ in range(ctx.repeats):
            ctx.flush()
            preload(q, n, "noop_async")
            config = {"url": ctx.url, "queue": ctx.queue, "handler": "noop_async", "concurrency": CONCURRENCY,
                      "django": django}
            with Child("drain", config) as child:
                reply = child.request({"n": n}, timeout=max(120.0, n / 100))
            check_settled(ctx.client, ctx.queue, n)
            peaks.append(reply["peak_rss_kb"] * 1024 / 1e6)
            before.append(reply["rss_before_kb"] * 1024 / 1e6)
        out.append(Measurement(
            "memory", label, "MB", peaks, jobs=n, lower_is_better=True,
            note=(f"draining {n:,} jobs, concurrency {CONCURRENCY}, async noop; "
                  f"{min(before):.0f} MB resident before the first job (interpreter and imports)"),
        ))
    return out
