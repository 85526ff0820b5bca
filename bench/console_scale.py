"""The console at the scale the engine runs: a big DLQ grouped, filtered and counted, and any job found by id.

The DLQ is built through the worker's own path. A real worker (``Worker``,
in this process) runs jobs that fail with a few kinds of error until
``REAL_DEAD`` of them are dead; the rest are written by ``build_dead``,
which does what the worker's settler does without running handlers: it adds
jobs to the stream, reads them as a consumer of the group and settles them
dead with ``settle.lua``, 1,000 per call, with the fingerprint the worker
computes. So every entry, and the index ``settle.lua`` keeps beside it, is
what a worker writes.

The queue also holds waiting jobs, a delayed set and a finished job with a
stored result, so a lookup by id is measured for each state.

Each row says its goal (issue 29's table) in ``scenarios.GOALS``. The size is
``--console-size N`` (default 1,000,000; 20,000 with ``--smoke``).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from datetime import UTC, datetime
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from chasqui_core.engine.dlq.fingerprint import error_group
from chasqui_core.engine.dlq.shared import split
from chasqui_core.engine.jobs.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.jobs.events import EVENTS_MAXLEN
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.store.scripts import Scripts

from .results import Measurement

_pack = msgpack.Packer(use_bin_type=False).pack
"""How the settler packs its items (str, not bin: cmsgpack reads only that)."""

SIZE_ENV = "CHASQUI_BENCH_CONSOLE_SIZE"
"""Where ``python -m bench --console-size N`` puts the size."""

SKIP_OPS_ENV = "CHASQUI_BENCH_CONSOLE_SKIP_OPS"
"""Set to 1 to leave out ``bench/console_ops.py``'s rows (free-text replay and search on a DLQ of their own)."""

REAL_DEAD = 2_000
"""Dead jobs a real worker produces before the rest of the DLQ is built through settle.lua."""

WAITING = 100_000
DELAYED = 1_000_000
"""Jobs in the stream and in the delayed set (at full size; a tenth of the DLQ's size at smaller ones)."""
SAME_DUE = 1_000
"""Delayed jobs added with one due time (a bulk schedule): a lookup finds its job among them by bisection."""

TASKS = tuple(f"shop.tasks.task_{k}" for k in range(8))
RARE_TASK = "shop.tasks.rare_refund"
"""One dead job in 100,000 is of this task (at least 3)."""

KINDS = (
    ("httpx.ReadTimeout", "upstream {host} did not answer in {n} ms"),
    ("builtins.ValueError", "order {n} has no line items"),
    ("builtins.KeyError", "'customer_{n}'"),
    ("shop.errors.PaymentDeclined", "card ending {n} declined by issuer"),
)
"""The error kinds of the built DLQ (class, message); the last is the rare one (1 in 997), and its jobs
are the only ``unrecoverable`` ones (the others ran out of retries)."""

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/.venv/lib/python3.12/site-packages/chasqui_core/engine/worker/worker.py", line 360, in _execute\n'
    "    result = await handler.fn(*args, **job.kwargs)\n"
    '  File "/srv/app/shop/tasks.py", line 42, in run\n'
    "    response = client.post(url, json=payload, timeout=5)\n"
    "{cls}: {message}\n"
)

GOAL_GROUPS = "grouped view"
GOAL_RARE = "rare filter, first page"
GOAL_COUNT = "filtered count"
GOAL_FIND = "find by id"
MEMORY = "memory per dead job, index included"


def label(size: int, case: str) -> str:
    return f"console-scale, {size:,} dead, {case}"


def size_asked(ctx) -> int:
    value = os.environ.get(SIZE_ENV)
    return int(value) if value else ctx.size(1_000_000, 20_000)


@dataclass
class Built:
    """What the scenario built, for the measurements (and for ``bench/console_ops.py`` when present)."""

    queue: str
    size: int
    rare_job_id: str
    """A dead job of RARE_TASK (the lookups' dead job)."""
    waiting_job_id: str
    delayed_job_ids: list[str]
    """A few delayed jobs picked at random, each timed once (a job found by ZSCAN is met by chance)."""
    finished_job_id: str


# --- building the DLQ -------------------------------------------------------------------------------------


def _kind(i: int) -> int:
    return 3 if i % 997 == 996 else i % 3


def _dead_items(i0: int, n: int, rare_every: int,
                kinds: Sequence[tuple[str, str]] | None = None) -> Iterator[tuple[str, str, str, str, bytes]]:
    """(task, job id, class, message, payload) of n dead jobs, the i-th of the whole DLQ from i0."""
    created = now_ms()
    for i in range(i0, i0 + n):
        cls, template = KINDS[_kind(i)] if kinds is None else kinds[i % len(kinds)]
        message = template.format(host=f"api-{i % 7}.example.com", n=i)
        task = RARE_TASK if i % rare_every == rare_every // 2 else TASKS[i % len(TASKS)]
        job_id = new_job_id()
        record = error_record(attempt=3, exc_class=cls, message=message,
                              traceback=TRACEBACK.format(cls=cls, message=message), worker="bench:1:a1",
                              started_at=created, finished_at=created + 12)
        job = Job(job_id, task, [i, "customer@example.com"], {"template": "receipt"}, attempt=3, created_at=created,
                  max_attempts=3, errors=[record])
        yield task, job_id, cls, message, job.encode()


def build_dead(client, queue: str, n: int, *, start: int = 0, chunk: int = 1000,
               rare_every: int = 100_000, kinds: Sequence[tuple[str, str]] | None = None,
               progress: Callable[[int], None] | None = None) -> list[str]:
    """Add ``n`` dead jobs through ``settle.lua`` as a worker settles them; returns their job ids.

    ``kinds``: (error class, message template) pairs to cycle through instead of ``KINDS``.

    Jobs go onto the stream (XADD), are read by a consumer of the group
    (XREADGROUP) and settled dead, ``chunk`` per call, with the dead items a
    worker's settler sends (reason, task, job id, error, fingerprint).
    """
    keys = QueueKeys.for_queue(queue)
    scripts = Scripts(client)
    try:
        client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    except Exception as exc:  # BUSYGROUP: it is there
        if "BUSYGROUP" not in str(exc):
            raise
    consumer = "bench-dlq-builder"
    job_ids: list[str] = []
    done = 0
    while done < n:
        size = min(chunk, n - done)
        items = list(_dead_items(start + done, size, rare_every, kinds))
        pipe = client.pipeline(transaction=False)
        for _, _, _, _, payload in items:
            pipe.xadd(keys.stream, {"j": payload})
        pipe.execute()
        [[_, rows]] = client.xreadgroup(GROUP, consumer, {keys.stream: ">"}, count=size)
        dead: list[Any] = []
        for (eid, _), (task, job_id, cls, message, payload) in zip(rows, items, strict=True):
            fp, text = error_group(cls, message)
            reason = "unrecoverable" if _kind(start + len(job_ids)) == 3 else "retries_exhausted"
            stored, texts = split(payload, cls, message)
            dead += (eid, stored, reason, task, job_id, cls, message, 1, 12, fp, text, texts)
            job_ids.append(job_id)
        args = [GROUP, keys.metrics, EVENTS_MAXLEN, b"", 0, 0, 0, size, _pack(dead), 0, 0, 0, 0, size]
        scripts.settle(keys=[keys.stream, keys.delayed, keys.dlq, keys.events, keys.running(consumer)], args=args)
        done += size
        if progress is not None:
            progress(done)
    return job_ids


def run_real_worker(url: str, queue: str, n: int) -> None:
    """A real worker runs ``n`` jobs that fail with the kinds above (no retries) until all are dead."""
    from chasqui_core.engine.store.connection import connect
    from chasqui_core.engine.producer.queue import JobSpec, Queue
    from chasqui_core.engine.jobs.registry import HandlerRegistry
    from chasqui_core.engine.settle.retry import RetryPolicy
    from chasqui_core.engine.worker.worker import Worker

    errors = {"timeout": TimeoutError, "value": ValueError, "key": KeyError}

    def fail(kind: str, i: int) -> None:
        raise errors[kind](f"order {i} failed ({kind})")

    registry = HandlerRegistry()
    registry.register("shop.tasks.fails", fail)
    client = connect(url)
    q = Queue(queue, redis_client=client)
    before = client.xlen(q.keys.dlq)
    q.add_bulk([JobSpec("shop.tasks.fails", [("timeout", "value", "key")[i % 3], i]) for i in range(n)])

    async def main() -> None:
        worker = Worker([queue], registry, url=url, concurrency=50, install_signal_handlers=False,
                        policy=RetryPolicy(max_attempts=1))
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + max(60.0, n / 200)
        try:
            while client.xlen(q.keys.dlq) < before + n:
                if task.done():
                    task.result()
                    raise RuntimeError("the worker stopped on its own")
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker did not dead-letter the jobs in time")
                await asyncio.sleep(0.05)
        finally:
            worker.request_stop()
            await task

    asyncio.run(main())
    client.close()


def build(ctx, size: int) -> Built:
    from chasqui_core.engine.producer.queue import JobSpec, Queue
    from chasqui_core.engine.jobs.results import encode_result

    client, queue = ctx.client, ctx.queue
    real = min(REAL_DEAD, size // 10)
    t0 = time.perf_counter()
    run_real_worker(ctx.url, queue, real)
    ctx.say(f"   a real worker dead-lettered {real:,} jobs in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    rare_every = max(1, min(100_000, (size - real) // 3))
    job_ids = build_dead(client, queue, size - real, rare_every=rare_every)
    rare = [job_ids[i] for i in range(len(job_ids)) if i % rare_every == rare_every // 2]
    ctx.say(f"   {size - real:,} more through settle.lua in {time.perf_counter() - t0:.1f} s "
            f"({len(rare)} of the rare task)")
    q = Queue(queue, redis_client=client)
    waiting = WAITING if size >= 1_000_000 else max(100, size // 10)
    delayed = DELAYED if size >= 1_000_000 else max(100, size // 10)
    t0 = time.perf_counter()
    added = []
    for start in range(0, waiting, 10_000):
        added += q.add_bulk([JobSpec("shop.tasks.waiting", [i]) for i in range(start, min(waiting, start + 10_000))])
    waiting_id = added[len(added) // 2].job_id
    delayed_ids = _add_delayed(client, queue, delayed, now_ms() + 86_400_000)
    finished_id = new_job_id()
    keys = QueueKeys.for_queue(queue)
    stamp = now_ms()
    client.set(keys.result + finished_id, encode_result(job_id=finished_id, task="shop.tasks.done", status="SUCCESSFUL",
                                                        args=[1], kwargs={}, enqueued_at=stamp, started_at=stamp,
                                                        finished_at=stamp + 3, return_value=42), px=3_600_000)
    ctx.say(f"   {waiting:,} waiting and {delayed:,} delayed jobs added in {time.perf_counter() - t0:.1f} s")
    return Built(queue, size, rare[0] if rare else job_ids[-1], waiting_id,
                 random.Random(7).sample(delayed_ids, 5), finished_id)


def _add_delayed(client, queue: str, n: int, at_ms: int) -> list[str]:
    """``n`` jobs in the delayed set, due from a day from now, through ``enqueue.lua`` (so each has its mark):
    bulk schedules of ``SAME_DUE`` jobs sharing one due time, a second apart."""
    from chasqui_core.engine.producer.queue import JobSpec, Queue

    q = Queue(queue, redis_client=client)
    ids = []
    for start in range(0, n, SAME_DUE):
        run_at = datetime.fromtimestamp((at_ms + start) / 1000, tz=UTC)
        added = q.add_bulk([JobSpec("shop.tasks.later", [i], run_at=run_at, attempts=3)
                            for i in range(start, min(n, start + SAME_DUE))])
        ids += [a.job_id for a in added]
    return ids


# --- measuring ------------------------------------------------------------------------------------------


def _time_ms(call: Callable[[], Any], repeats: int) -> list[float]:
    call()  # warm-up
    samples = []
    for _ in range(max(repeats, 3)):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def measure(ctx, built: Built) -> list[Measurement]:
    from chasqui_core.engine.dlq.filter import DLQFilter
    from chasqui_core.engine.dlq.replay import DeadLetters
    from chasqui_core.engine.ops.lookup import find_job

    dl = DeadLetters(ctx.client, built.queue)
    size, out = built.size, []
    length = dl.count()
    memory = ctx.server.used_memory_mb()

    def row(case: str, call: Callable[[], Any], note: str) -> None:
        out.append(Measurement("console-scale", label(size, case), "ms", _time_ms(call, ctx.repeats), jobs=size,
                               lower_is_better=True, note=f"{note}; server memory {memory:,.0f} MB"))

    index_mb = index_memory_mb(ctx.client, built.queue)
    entry_bytes, index_bytes, shared_bytes = dead_job_bytes(ctx.client, built.queue)
    out.append(Measurement("console-scale", label(size, MEMORY), "bytes",
                           [(entry_bytes + index_bytes + shared_bytes) / length], jobs=size, lower_is_better=True,
                           note=f"{entry_bytes / length:,.0f} for the entry, "
                                f"{index_bytes / length:,.0f} for the index, "
                                f"{shared_bytes / length:,.1f} for the texts kept once per error group "
                                f"(MEMORY USAGE of every key, the stream's counted whole)"))
    grouping = dl.grouping()
    shown = sum(g.count for g in grouping.groups)
    adds_up = shown + grouping.other_entries == length
    row(GOAL_GROUPS, dl.grouping,
        f"{len(grouping.groups)} groups over the whole DLQ ({'index' if grouping.whole else 'SCAN'}); counts "
        f"{shown:,} + {grouping.other_entries:,} in groups not shown = {shown + grouping.other_entries:,} of "
        f"{length:,} entries ({'add up' if adds_up else 'DO NOT add up'}); the index takes {index_mb:,.0f} MB")

    rare_fp = error_group(KINDS[3][0], KINDS[3][1].format(host="", n=1))[0]
    filters = (
        ("task", DLQFilter(task=RARE_TASK)),
        ("error class", DLQFilter(error_class="PaymentDeclined")),
        ("group", DLQFilter(fingerprint=rare_fp)),
        ("reason", DLQFilter(reason="unrecoverable")),
        ("task and reason", DLQFilter(task=TASKS[1], reason="unrecoverable")),
    )
    for name, f in filters:
        page = dl.page(filter=f, limit=50)
        matching = dl.count_matching(f)
        complete = len(page.items) == min(50, matching)
        row(f"{GOAL_RARE} ({name})", lambda f=f: dl.page(filter=f, limit=50),
            f"{len(page.items)} items of {matching:,} matching, {page.scanned:,} index ids read; "
            f"{'complete page' if complete else 'INCOMPLETE page'}")
    for name, f in (("error class, 1 in 3", DLQFilter(error_class="ValueError")),
                    ("task and reason", DLQFilter(task=TASKS[1], reason="unrecoverable"))):
        matching = dl.count_matching(f)
        row(f"{GOAL_COUNT} ({name})", lambda f=f: dl.count_matching(f), f"{matching:,} matching")

    for state, job_id in (("dead", built.rare_job_id), ("waiting", built.waiting_job_id),
                          ("finished", built.finished_job_id)):
        found = find_job(ctx.client, job_id, [built.queue], zscan_limit=10_000_000)
        row(f"{GOAL_FIND} ({state})", lambda job_id=job_id: find_job(ctx.client, job_id, [built.queue],
                                                                     zscan_limit=10_000_000),
            f"found as {found.state}, {found.scanned:,} entries read")
    samples, read = [], []
    for job_id in built.delayed_job_ids:
        t0 = time.perf_counter()
        found = find_job(ctx.client, job_id, [built.queue], zscan_limit=10_000_000)
        samples.append((time.perf_counter() - t0) * 1000)
        marked = any("at the job's mark: found" in note for note in found.searched)
        read.append(("at its mark" if marked else f"{found.scanned:,} read") if found.state == "delayed"
                    else "NOT FOUND")
    out.append(Measurement("console-scale", label(size, f"{GOAL_FIND} (delayed)"), "ms", samples, jobs=size,
                           lower_is_better=True,
                           note=f"{len(samples)} jobs picked at random, each looked up once, among "
                                f"{SAME_DUE:,} sharing its due time: found {', '.join(read)}; "
                                f"server memory {memory:,.0f} MB"))
    return out


def index_memory_mb(client, queue: str) -> float:
    """What the DLQ's index keys take on the server (MEMORY USAGE, sampled for the big ones)."""
    from chasqui_core.engine.dlq.index import IndexKeys

    prefix = IndexKeys.for_queue(QueueKeys.for_queue(queue)).prefix
    total = sum(int(client.memory_usage(key) or 0) for key in client.scan_iter(match=prefix + "*", count=1000))
    return total / 1e6


def dead_job_bytes(client, queue: str) -> tuple[int, int, int]:
    """Bytes of the DLQ stream (counted whole), of its index, and of the texts its groups share."""
    from chasqui_core.engine.dlq.index import IndexKeys

    keys = QueueKeys.for_queue(queue)
    prefix = IndexKeys.for_queue(keys).prefix

    def usage(pattern: str) -> int:
        return sum(int(client.memory_usage(key, samples=0) or 0)
                   for key in client.scan_iter(match=pattern, count=1000))

    return int(client.memory_usage(keys.dlq, samples=0) or 0), usage(prefix + "*"), usage(keys.dlq + ":tb:*")


def extra_measurements(ctx, built: Built) -> list[Measurement]:
    """The rest of the goals: bulk replay by an indexed filter on this DLQ (bench/console_bulk.py), bulk replay by
    free text and search (bench/console_ops.py, on a DLQ of their own), and a first failure's way to the overview
    (bench/console_live.py, run alone: ``python -m bench.console_live``)."""
    from . import console_bulk, console_ops

    result: list[Measurement] = console_bulk.run(ctx, built, RARE_TASK)
    if os.environ.get(SKIP_OPS_ENV) != "1":
        result += console_ops.run(ctx, built)
    return result


def run(ctx) -> list[Measurement]:
    size = size_asked(ctx)
    ctx.flush()
    t0 = time.perf_counter()
    built = build(ctx, size)
    ctx.say(f"   built in {time.perf_counter() - t0:.1f} s; server memory {ctx.server.used_memory_mb():,.0f} MB")
    out = measure(ctx, built)
    out += extra_measurements(ctx, built)
    ctx.flush()
    return out
