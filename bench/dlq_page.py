"""The console's DLQ page: how long ``DeadLetters.page(limit=50)`` takes on a big DLQ.

The DLQ is filled with entries shaped like the ones ``settle.lua`` writes
(an encoded job carrying one error record with a traceback, reason, task,
job id, source id, error class and message), by pipelined XADDs. Pages are
timed newest first (what the console opens), from the middle (a cursor),
and filtered, including a filter nothing matches (the longest scan a page
may do).
"""

from __future__ import annotations

import time
from functools import partial

from chasqui_core.engine.jobs.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.store.keys import QueueKeys

from .resp import RawPipe, encode
from .results import Measurement

TASKS = tuple(f"shop.tasks.task_{k}" for k in range(10))
ERRORS = ("TimeoutError", "ValueError", "KeyError", "ConnectionError", "PermissionError",
          "RuntimeError", "OSError", "TypeError", "IndexError", "LookupError")
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/.venv/lib/python3.12/site-packages/chasqui_core/engine/worker/worker.py", line 360, in _execute\n'
    "    result = await handler.fn(*args, **job.kwargs)\n"
    '  File "/srv/app/shop/tasks.py", line 42, in send_receipt\n'
    "    response = client.post(url, json=payload, timeout=5)\n"
    '  File "/srv/app/.venv/lib/python3.12/site-packages/httpx/_client.py", line 1144, in post\n'
    "    return self.request(\"POST\", url, json=json, timeout=timeout)\n"
    "{cls}: upstream did not answer in time (order {i})\n"
)
CALLS_PER_SAMPLE = 5


def label(size: int, case: str = "") -> str:
    return f"dlq-page, {size:,} entries" + (f", {case}" if case else "")


def _entries(size: int):
    created = now_ms()
    for i in range(size):
        task, cls = TASKS[i % 10], ERRORS[(i // 10) % 10]
        message = f"upstream did not answer in time (order {i})"
        job_id = new_job_id()
        record = error_record(attempt=3, exc_class=cls, message=message, traceback=TRACEBACK.format(cls=cls, i=i),
                              worker="web-1:4242:a1b2c3", started_at=created, finished_at=created + 5012)
        job = Job(job_id, task, [i, "customer@example.com"], {"template": "receipt"}, 3, created, 3,
                  None, [record], 0, 0, 0, {"backend": "default"})
        yield job_id, task, cls, message, job.encode()


def fill(client, queue: str, size: int) -> str:
    """Write ``size`` dead jobs; return the entry id in the middle."""
    dlq = QueueKeys.for_queue(queue).dlq
    middle = ""
    batch: list[bytes] = []
    done = 0
    with RawPipe(client) as pipe:
        for job_id, task, cls, message, payload in _entries(size):
            batch.append(encode(("XADD", dlq, "*", "j", payload, "reason", "retries_exhausted", "task", task,
                                 "job_id", job_id, "source_id", f"{now_ms()}-0", "error_class", cls,
                                 "error", message)))
            if len(batch) == 1000:
                ids = pipe.run(b"".join(batch), len(batch))
                if done <= size // 2 < done + len(ids):
                    middle = ids[size // 2 - done].decode()
                done += len(ids)
                batch = []
        if batch:
            ids = pipe.run(b"".join(batch), len(batch))
            if done <= size // 2 < done + len(ids):
                middle = ids[size // 2 - done].decode()
    return middle


def _time_ms(call, repeats: int) -> list[float]:
    call()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(CALLS_PER_SAMPLE):
            call()
        samples.append((time.perf_counter() - t0) * 1000 / CALLS_PER_SAMPLE)
    return samples


def run(ctx) -> list[Measurement]:
    from chasqui_core.engine.dlq.filter import DLQFilter
    from chasqui_core.engine.dlq.index import DLQIndex
    from chasqui_core.engine.dlq.replay import DeadLetters

    out = []
    for size in ctx.size((200_000, 1_000_000), (2_000,)):
        ctx.flush()
        t0 = time.perf_counter()
        middle = fill(ctx.client, ctx.queue, size)
        fill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        DLQIndex(ctx.client, ctx.queue).rebuild()  # written by plain XADDs: index them as an upgrade would
        index_s = time.perf_counter() - t0
        memory = ctx.server.used_memory_mb()
        ctx.say(f"   filled {size:,} DLQ entries in {fill_s:.1f} s, indexed them in {index_s:.1f} s "
                f"({size / index_s:,.0f} entries/s); server memory {memory:,.0f} MB")
        dl = DeadLetters(ctx.client, ctx.queue)
        cases = (
            ("", partial(dl.page, limit=50), "newest page, no filter (what the console opens)"),
            ("page from the middle", partial(dl.page, cursor=middle, limit=50), "cursor half way down"),
            ("filtered, 1 in 10 match", partial(dl.page, limit=50, filter=DLQFilter(error_class="TimeoutError")),
             "filter on error class"),
            ("filter matching nothing", partial(dl.page, limit=50, filter=DLQFilter(task="shop.tasks.absent")),
             "the index has no such task"),
        )
        for case, call, what in cases:
            page = call()
            note = f"{what}; {len(page.items)} items, {page.scanned:,} entries read; server memory {memory:,.0f} MB"
            out.append(Measurement("dlq-page", label(size, case), "ms", _time_ms(call, ctx.repeats), jobs=size,
                                   lower_is_better=True, note=note))
    ctx.flush()
    return out
