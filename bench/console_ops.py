"""Bulk DLQ operations and free-text search at console scale.

What an operator waits for when acting on a big filtered set of dead jobs,
measured the way the console does it, against a real server:

- confirmation: the figure the confirmation shows (``estimate_matching``, exact when a bounded read
  can tell, else "about"), for a filter matching ``size`` entries;
- first progress: from recording the operation (what the console's POST does) until its record shows
  entries handled, with a runner process polling for operations as a worker's operations part does;
- throughput: matching entries handled per second by that runner, start to end;
- paced replay: a replay with a rate (jobs/s), the rate reached against the rate asked;
- search: DLQ entries read per second by a text search that matches a handful of entries, end to end from
  Python, over the whole DLQ ``SEARCH_REPEATS`` times (a shared machine's noise shows in their spread).

``measure(client, url, queue, size)`` returns the figures (``ConsoleOpsFigures``) for the console-scale
scenario to report; ``python -m bench.console_ops --size 100000`` runs it alone on a private server.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import uuid
from dataclasses import asdict, dataclass

from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.dlq.estimate import estimate_matching
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.operations import POLL_S, Operations
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.dlq.search import TextSearch
from chasqui_core.engine.jobs.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.store.keys import QueueKeys

from .dlq_page import fill
from .resp import RawPipe, encode
from .results import Measurement

MATCHING = "upstream did not answer"
"""The error text every entry ``dlq_page.fill`` writes has: the filtered set."""
RARE = "needle-7f3a"
SEARCH_REPEATS = 5


@dataclass(frozen=True, slots=True)
class ConsoleOpsFigures:
    size: int
    """Entries in the filtered set."""
    dlq_size: int
    confirm_ms: float
    confirm_exact: bool
    confirm_count: int
    first_progress_ms: float
    """From recording the operation until its record showed entries handled."""
    replay_s: float
    replay_per_s: float
    paced_rate: int
    paced_count: int
    paced_per_s: float
    search_scanned: int
    search_found: int
    search_per_s: float
    """The median of ``search_rates``."""
    search_rates: list[float]


def _others(client, queue: str, n: int, message: str, *, rare_every: int = 0) -> None:
    """``n`` dead jobs whose error is ``message`` (not in the filtered set); every ``rare_every``-th holds RARE."""
    dlq = QueueKeys.for_queue(queue).dlq
    created = now_ms()
    with RawPipe(client) as pipe:
        for start in range(0, n, 1000):
            batch = []
            for i in range(start, min(n, start + 1000)):
                arg = RARE if rare_every and i % rare_every == rare_every - 1 else f"card-{i}"
                record = error_record(
                    attempt=3,
                    exc_class="PaymentError",
                    message=message,
                    traceback="",
                    worker="w",
                    started_at=created,
                    finished_at=created + 5,
                )
                job = Job(new_job_id(), "shop.tasks.charge", [arg], {}, 3, created, 3, None, [record])
                batch.append(
                    encode(
                        (
                            "XADD",
                            dlq,
                            "*",
                            "j",
                            job.encode(),
                            "reason",
                            "retries_exhausted",
                            "task",
                            "shop.tasks.charge",
                            "job_id",
                            job.id,
                            "source_id",
                            "1-0",
                            "error_class",
                            "PaymentError",
                            "error",
                            message,
                        )
                    )
                )
            pipe.run(b"".join(batch), len(batch))


def _runner(url: str, queue: str, stop) -> None:
    """A worker's operations part, alone in a process: look every POLL_S, claim, run."""
    client = connect(url)
    ops = Operations(client, queue)
    owner = f"bench-runner:{uuid.uuid4().hex[:6]}"
    while not stop.is_set():
        op_id = ops.claim_next(owner)
        if op_id is None:
            time.sleep(POLL_S)
            continue
        ops.run(op_id, owner, should_stop=stop.is_set)


def _follow(ops: Operations, op_id: str, t0: float, timeout: float) -> tuple[float, dict]:
    """Poll the record until it ends; (ms until the first progress, final record as a dict)."""
    first = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = ops.get(op_id)
        if record is not None:
            if first is None and record.done > 0:
                first = (time.perf_counter() - t0) * 1000
            if record.finished:
                return first if first is not None else float("nan"), asdict(record)
        time.sleep(0.01)
    raise RuntimeError(f"operation {op_id} did not finish within {timeout:.0f} s")


def measure(
    client, url: str, queue: str, size: int, *, paced_rate: int = 5000, paced_seconds: float = 3.0, say=print
) -> ConsoleOpsFigures:
    """Fill the DLQ of ``queue`` (``size`` matching + a quarter as many others), then time each step."""
    t = time.perf_counter()
    fill(client, queue, size)
    _others(client, queue, size // 4, "card declined", rare_every=max(1, size // 4 // 5))
    dl = DeadLetters(client, queue)
    dlq_size = dl.count()
    say(f"   filled {dlq_size:,} DLQ entries in {time.perf_counter() - t:.1f} s")

    # free-text search over everything: a needle in five entries
    search = TextSearch(client, queue)
    rates: list[float] = []
    for _ in range(SEARCH_REPEATS):
        t = time.perf_counter()
        page = search.search(RARE, time_limit=3600, scan_limit=10**9)
        found = len(page.items)
        while page.next_cursor:  # more than a page: carry on (not expected with five matches)
            page = search.search(RARE, cursor=page.next_cursor, time_limit=3600, scan_limit=10**9)
            found += len(page.items)
        rates.append(dlq_size / (time.perf_counter() - t))
    say(f"   search: {dlq_size:,} entries read at {statistics.median(rates):,.0f}/s (median of {len(rates)}, "
        f"best {max(rates):,.0f}/s), {found} found")

    f = DLQFilter(error_text=MATCHING)
    t = time.perf_counter()
    estimate = estimate_matching(dl, f)
    confirm_ms = (time.perf_counter() - t) * 1000
    say(f"   confirmation: {'' if estimate.exact else 'about '}{estimate.count:,} in {confirm_ms:.0f} ms")

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    runner = ctx.Process(target=_runner, args=(url, queue, stop), daemon=True)
    runner.start()
    try:
        time.sleep(2.0)  # the runner is up and polling, as a worker would be
        ops = Operations(client, queue)
        op_id = uuid.uuid4().hex
        t0 = time.perf_counter()
        ops.submit(op_id, "replay", f, total=estimate.count, total_exact=estimate.exact)
        first_ms, record = _follow(ops, op_id, t0, timeout=600)
        replay_s = (record["finished_ms"] - record["started_ms"]) / 1000
        say(f"   replay: first progress after {first_ms:.0f} ms; {record['count']:,} replayed in {replay_s:.2f} s")

        paced_n = int(paced_rate * paced_seconds)
        _others(client, queue, paced_n, "paced batch")
        op_id = uuid.uuid4().hex
        ops.submit(op_id, "replay", DLQFilter(error_text="paced batch"), rate=paced_rate, total=paced_n)
        _, paced = _follow(ops, op_id, time.perf_counter(), timeout=600)
        paced_s = (paced["finished_ms"] - paced["started_ms"]) / 1000
        say(
            f"   paced replay at {paced_rate:,}/s: {paced['count']:,} in {paced_s:.2f} s "
            f"({paced['count'] / paced_s:,.0f}/s)"
        )
    finally:
        stop.set()
        runner.join(30)
    return ConsoleOpsFigures(
        size=size,
        dlq_size=dlq_size,
        confirm_ms=confirm_ms,
        confirm_exact=estimate.exact,
        confirm_count=estimate.count,
        first_progress_ms=first_ms,
        replay_s=replay_s,
        replay_per_s=record["count"] / replay_s if replay_s else float("inf"),
        paced_rate=paced_rate,
        paced_count=paced["count"],
        paced_per_s=paced["count"] / paced_s if paced_s else float("inf"),
        search_scanned=dlq_size,
        search_found=found,
        search_per_s=statistics.median(rates),
        search_rates=rates,
    )


OPS_SIZE = 100_000
"""The filtered set the console-scale scenario replays (issue 29's "a 100,000 filtered set")."""
CONFIRM, FIRST_PROGRESS, REPLAY_RATE, PACED, SEARCH = (
    "bulk replay: confirmation", "bulk replay: first progress", "bulk replay: entries/s",
    "bulk replay, paced: entries/s", "free-text search: entries scanned/s")


def label(size: int, case: str) -> str:
    return f"console-scale, {size:,} filtered, {case}"


def run(ctx, built) -> list[Measurement]:
    """The console-scale scenario's bulk-replay and search rows, on a DLQ of their own (``built`` is unused)."""
    size = ctx.size(OPS_SIZE, 2_000)
    fig = measure(ctx.client, ctx.url, "console-ops", size, say=ctx.say)
    note = f"{fig.dlq_size:,} entries in the DLQ, {fig.size:,} matching a free-text filter"
    return [
        Measurement("console-scale", label(size, CONFIRM), "ms", [round(fig.confirm_ms, 1)], jobs=fig.size,
                    lower_is_better=True,
                    note=f"{note}; {'exact' if fig.confirm_exact else 'about'} {fig.confirm_count:,}"),
        Measurement("console-scale", label(size, FIRST_PROGRESS), "ms", [round(fig.first_progress_ms, 1)],
                    jobs=fig.size, lower_is_better=True, note=f"{note}; from recording it to entries handled"),
        Measurement("console-scale", label(size, REPLAY_RATE), "jobs/s", [round(fig.replay_per_s)], jobs=fig.size,
                    note=f"{note}; run by a worker's operations part in another process"),
        Measurement("console-scale", label(size, PACED), "jobs/s", [round(fig.paced_per_s)], jobs=fig.paced_count,
                    note=f"asked for {fig.paced_rate:,}/s"),
        Measurement("console-scale", label(size, SEARCH), "jobs/s", [round(r) for r in fig.search_rates],
                    jobs=fig.search_scanned, note=f"{fig.search_found} found, end to end from Python"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console_ops", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000, help="entries in the filtered set (default 100,000)")
    parser.add_argument("--rate", type=int, default=5000, help="the paced replay's rate in jobs/s (default 5,000)")
    args = parser.parse_args(argv)
    from .server import BenchServer

    with BenchServer() as server:
        server.flush()
        figures = measure(server.client, server.url, "console-ops", args.size, paced_rate=args.rate)
    print()
    print(f"filtered set {figures.size:,} of {figures.dlq_size:,} dead jobs")
    print(
        f"confirmation          {figures.confirm_ms:8.0f} ms   (goal < 1,000; "
        f"{'exact' if figures.confirm_exact else 'about'} {figures.confirm_count:,})"
    )
    print(f"first progress        {figures.first_progress_ms:8.0f} ms   (goal < 1,000)")
    print(f"bulk replay           {figures.replay_per_s:8,.0f} /s   (goal >= 10,000)")
    print(
        f"paced replay          {figures.paced_per_s:8,.0f} /s   (asked {figures.paced_rate:,}/s, "
        f"{figures.paced_per_s / figures.paced_rate:.0%})"
    )
    print(
        f"text search           {figures.search_per_s:8,.0f} /s   (goal >= 200,000; median of "
        f"{len(figures.search_rates)}, best {max(figures.search_rates):,.0f}/s; {figures.search_found} found)"
    )


if __name__ == "__main__":
    main()
