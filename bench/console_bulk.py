"""Bulk replays by a filter the DLQ's index keeps, on the DLQ ``console_scale`` built (a third of it ValueErrors).

What an operator meets acting on a big DLQ by task or error class, measured
against a real server with a runner in another process (a worker's
operations part), and what each step takes out of Redis (its
``total_net_output_bytes``: a sweep that reads the whole DLQ sends every
entry out):

- inline: the replay of the rare task (a handful of entries, under
  ``BACKGROUND_THRESHOLD``, so the console runs it inside its request);
- stop: an operation replaying every ``ValueError``, stopped after a third;
  what its record says it handled, of how many;
- second run: the same filter again, from recording it to its first entries
  handled, and its pace to the end;
- find by id: the job replayed inline (waiting in the stream now), and an id
  nobody used, where it leads (the API's default and the console's job page,
  which say what they left unread) and everywhere (the API's ``?search=all``).
"""

from __future__ import annotations

import multiprocessing
import time

from chasqui_core.engine.dlq.estimate import estimate_matching
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.operations import Operations
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.envelope import new_job_id
from chasqui_core.engine.ops.lookup import find_job

from .console_ops import _runner
from .results import Measurement

FILTER = DLQFilter(error_class="ValueError")
INLINE, STOP, SECOND_FIRST, SECOND_RATE, SECOND_READ, FIND_REPLAYED, FIND_UNKNOWN, FIND_UNKNOWN_ALL = (
    "indexed replay: inline, the rare task",
    "indexed replay: stopped after a third, handled of total",
    "indexed replay: a second run, first progress",
    "indexed replay: a second run, entries/s",
    "indexed replay: a second run, bytes out of Redis per entry",
    "find by id (replayed)",
    "find by id (unknown): where the id leads (the API's default, the job page)",
    "find by id (unknown): every place read (the API's ?search=all)",
)


def label(size: int, case: str) -> str:
    return f"console-scale, {size:,} dead, {case}"


def _sent(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def _wait(ops: Operations, op_id: str, until, timeout: float = 900.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = ops.get(op_id)
        if record is not None and until(record):
            return record
        time.sleep(0.01)
    raise RuntimeError(f"operation {op_id} did not get there within {timeout:.0f} s")


def run(ctx, built, rare_task: str) -> list[Measurement]:
    """The rows on ``built``'s DLQ; ``rare_task`` is its task of a handful of dead jobs (the inline replay)."""
    client, queue, size = ctx.client, built.queue, built.size
    dl = DeadLetters(client, queue)
    out: list[Measurement] = []
    length = dl.count()

    rare = DLQFilter(task=rare_task)
    before, t0 = _sent(client), time.perf_counter()
    moved = dl.replay_matching(rare)
    inline_ms = (time.perf_counter() - t0) * 1000
    inline_mb = (_sent(client) - before) / 1e6
    ctx.say(f"   inline replay of {moved} rare jobs in {inline_ms:.0f} ms, {inline_mb:.2f} MB out of Redis")
    out.append(
        Measurement(
            "console-scale",
            label(size, INLINE),
            "ms",
            [round(inline_ms, 1)],
            jobs=moved,
            lower_is_better=True,
            note=f"{moved} replayed of {length:,} dead; {inline_mb:.2f} MB out of Redis",
        )
    )

    mp = multiprocessing.get_context("spawn")
    stop = mp.Event()
    runner = mp.Process(target=_runner, args=(ctx.url, queue, stop), daemon=True)
    runner.start()
    try:
        time.sleep(2.0)  # the runner is up and polling, as a worker would be
        ops = Operations(client, queue)
        estimate = estimate_matching(dl, FILTER)
        ops.submit("first", "replay", FILTER, total=estimate.count, total_exact=estimate.exact)
        _wait(ops, "first", lambda r: r.done >= estimate.count // 3 or r.finished)
        ops.cancel("first")
        first = _wait(ops, "first", lambda r: r.finished)
        said = f"{first.done:,} of {first.total:,} handled, {first.state}"
        ctx.say(f"   stopped: {said} ({dl.count_matching(FILTER):,} left in the DLQ)")
        out.append(
            Measurement(
                "console-scale",
                label(size, STOP),
                "entries",
                [first.done],
                jobs=first.total,
                note=f"the record says {said}; {dl.count_matching(FILTER):,} still match",
            )
        )

        left = dl.count_matching(FILTER)
        before, t0 = _sent(client), time.perf_counter()
        ops.submit("second", "replay", FILTER, total=left, total_exact=True)
        _wait(ops, "second", lambda r: r.done > 0 or r.finished)
        first_ms = (time.perf_counter() - t0) * 1000
        second = _wait(ops, "second", lambda r: r.finished)
        mb = (_sent(client) - before) / 1e6
        secs = max(1e-6, ((second.finished_ms or 0) - (second.started_ms or 0)) / 1000)
        rate = second.count / secs
        ctx.say(
            f"   second run: first progress after {first_ms:.0f} ms; {second.count:,} in {secs:.2f} s "
            f"({rate:,.0f}/s), {mb:,.1f} MB out of Redis"
        )
        out.append(
            Measurement(
                "console-scale",
                label(size, SECOND_FIRST),
                "ms",
                [round(first_ms, 1)],
                jobs=left,
                lower_is_better=True,
                note=f"{left:,} left to replay after the stopped run; from recording it",
            )
        )
        out.append(
            Measurement(
                "console-scale",
                label(size, SECOND_RATE),
                "jobs/s",
                [round(rate)],
                jobs=second.count,
                note="run by a worker's operations part in another process",
            )
        )
        out.append(
            Measurement(
                "console-scale",
                label(size, SECOND_READ),
                "bytes",
                [round(mb * 1e6 / max(1, second.count))],
                jobs=second.count,
                lower_is_better=True,
                note=f"{mb:,.1f} MB for {second.count:,} replayed out of a DLQ of {length:,}",
            )
        )
    finally:
        stop.set()
        runner.join(30)

    unknown = new_job_id()
    for case, job_id, wide in ((FIND_REPLAYED, built.rare_job_id, False), (FIND_UNKNOWN, unknown, False),
                               (FIND_UNKNOWN_ALL, unknown, True)):
        samples = []
        for _ in range(max(3, ctx.repeats)):
            t0 = time.perf_counter()
            found = find_job(client, job_id, [queue], wide=wide)
            samples.append((time.perf_counter() - t0) * 1000)
        out.append(
            Measurement(
                "console-scale",
                label(size, case),
                "ms",
                samples,
                jobs=size,
                lower_is_better=True,
                note=f"found as {found.state}, {found.scanned:,} entries read"
                + (", the rest named as not read" if found.narrowed else ""),
            )
        )
    return out
