"""A queue's history over the console's time ranges (1 hour, 24 hours, 7 days): failures, and runs per task.

What exists without this module: per-second buckets (kept an hour), per-minute
buckets (kept 25 hours), and all-time counters and per-task run-duration
histograms (``totals.py``). A 7-day range and any per-task range need more,
and the settle path must not pay for it. So nothing is added per job: every
worker's housekeeping calls ``snapshot`` every few seconds, and ``rollup.lua``
copies the all-time counters and histograms into a snapshot hash once per
period (the first caller of a period writes it, the others find it there):

- ``<metrics>snap:5m:<epoch 5-minute>``, kept 2 hours: the 1-hour range.
- ``<metrics>snap:1h:<epoch hour>``, kept 8 days: the 24-hour and 7-day ranges,
  and the 7-day failures chart (one point per hour, the difference of two
  consecutive snapshots).

A range's per-task figures are the histograms now less those of the snapshot
at the range's start (the first one taken at or after it, when a period had
no worker running); ``Window.since_ms`` says which moment that was. Run time
per task is shown as runs, mean, and p50 / p95 read from the histogram's
buckets (the bucket's upper bound: "95% of runs took at most ..."). Failures
per task are the ``fail:<task>`` counts settle.lua adds with the histogram.
Failures over time come from the minute buckets (1 hour, 24 hours) and the
hourly snapshots (7 days).

Memory: a snapshot holds the queue's counters and its histograms' non-zero
fields (a few per task); 24 five-minute and 192 hourly snapshots live at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import SNAPSHOT_1H, SNAPSHOT_5M, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.ops.totals import DURATION_BOUNDS_MS, DurationHistogram, histograms

SNAPSHOTS: tuple[tuple[str, int, int], ...] = (
    (SNAPSHOT_5M, 300, 2 * 3600),
    (SNAPSHOT_1H, 3600, 8 * 24 * 3600 + 3600),
)
"""(key part after the queue's metrics prefix, period s, lifetime s) of each kind of snapshot."""

SNAPSHOT_EVERY_S = 15.0
"""How often a worker offers to take the snapshots (a period's first offer writes it)."""


@dataclass(frozen=True, slots=True)
class Range:
    name: str
    label: str
    seconds: int
    snapshot: int
    """Index into SNAPSHOTS of the snapshots a range's start is read from."""
    step_s: int
    """Seconds per point of the failures chart."""


RANGES: dict[str, Range] = {
    "1h": Range("1h", "1 hour", 3600, 0, 60),
    "24h": Range("24h", "24 hours", 24 * 3600, 1, 900),
    "7d": Range("7d", "7 days", 7 * 24 * 3600, 1, 3600),
}
SEARCH_AHEAD = 4
"""Snapshots tried after a range's start when the one at the start is missing (no worker ran then)."""


def snapshot_args() -> list[int | str]:
    args: list[int | str] = [len(SNAPSHOTS)]
    for part, period, _ in SNAPSHOTS:
        args += (part, period)
    args += [ttl for _, _, ttl in SNAPSHOTS]
    return args


def snapshot(scripts: Scripts, keys: QueueKeys) -> int:
    """Offer the queue's snapshots now; returns how many were written (0 when this period's exist)."""
    return int(scripts.rollup(keys=[keys.metrics], args=snapshot_args()))


@dataclass(frozen=True, slots=True)
class TaskFigures:
    task: str
    runs: int
    failures: int
    mean_ms: float
    p50_ms: int | None
    """Upper bound of the bucket holding the median run; None above the last bound (over 5 minutes)."""
    p95_ms: int | None


@dataclass(frozen=True, slots=True)
class Window:
    queue: str
    range: Range
    now_ms: int
    since_ms: int | None
    """When the snapshot the per-task figures start from was taken; None: no snapshot, figures are all-time."""
    tasks: list[TaskFigures]
    """Busiest first."""
    failures: list[int | None]
    """Failed runs per chart step (``range.step_s``), oldest first; None where no snapshot tells."""
    start_ms: int


def quantile_ms(h: DurationHistogram, q: float) -> int | None:
    """The upper bound of the bucket that holds the ``q`` quantile of the runs; None above the last bound."""
    total = h.count
    if not total:
        return None
    target, seen = q * total, 0
    for bound, n in zip(DURATION_BOUNDS_MS, h.counts, strict=False):
        seen += n
        if seen >= target:
            return bound
    return None


def _text(v: bytes | str) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _minus(now: dict[str, int], base: dict[str, int]) -> dict[str, int]:
    return {k: v - base.get(k, 0) for k, v in now.items() if v - base.get(k, 0) > 0}


def window(client: Client, queue: str, range_name: str) -> Window:
    """The queue's failures over the range and its per-task figures since the range's start.

    Three round trips: the server's clock; the histograms with the range's snapshots; the minute buckets'
    ``failed`` fields (1 h, 24 h; for 7 d the hourly snapshots come with the second).
    """
    rng = RANGES.get(range_name)
    if rng is None:
        raise ValueError(f"range must be one of {', '.join(RANGES)}, not {range_name!r}")
    keys = QueueKeys.for_queue(queue)
    part, period, _ = SNAPSHOTS[rng.snapshot]
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    start_s = now_ms // 1000 - rng.seconds
    first = start_s // period
    hourly_part, hour = SNAPSHOTS[1][0], 3600
    points = rng.seconds // rng.step_s
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.durations)
    for i in range(SEARCH_AHEAD + 1):
        pipe.hgetall(f"{keys.metrics}{part}{first + i}")
    if rng.name == "7d":  # the hourly snapshots of the last 7 days, then the counter now: the last hour so far
        first_hour = now_ms // 1000 // hour - points + 1
        for h in range(first_hour, first_hour + points):
            pipe.hget(f"{keys.metrics}{hourly_part}{h}", "t:failed")
        pipe.hget(keys.totals, "failed")
    replies = pipe.execute()
    current = {_text(k): int(v) for k, v in replies[0].items()}
    since_ms, base = None, None
    for snap in replies[1 : SEARCH_AHEAD + 2]:
        if snap:
            fields = {_text(k): v for k, v in snap.items()}
            since_ms = int(fields.pop("_at"))
            base = {k: int(v) for k, v in fields.items() if not k.startswith("t:")}
            break
    diff = _minus(current, base) if base is not None else current
    tasks = [
        TaskFigures(
            h.task,
            h.count,
            h.failures,
            h.sum_ms / h.count if h.count else 0.0,
            quantile_ms(h, 0.5),
            quantile_ms(h, 0.95),
        )
        for h in histograms(diff).values()
        if h.count or h.failures
    ]
    tasks.sort(key=lambda t: (-t.runs, t.task))
    if rng.name == "7d":
        marks = [None if r is None else int(r) for r in replies[SEARCH_AHEAD + 2 :]]
        marks[-1] = marks[-1] or 0  # no failure ever: the counter is not there yet
        failures = [None if a is None or b is None else max(0, b - a) for a, b in zip(marks, marks[1:], strict=False)]
        start_ms = first_hour * hour * 1000
    else:  # the minute buckets' `failed` field only: one small HGET per minute, one round trip
        last_minute = now_ms // 60_000
        first_minute = last_minute - rng.seconds // 60 + 1
        pipe = client.pipeline(transaction=False)
        for m in range(first_minute, last_minute + 1):
            pipe.hget(f"{keys.minute_counters}{m}", "failed")
        per_minute = [int(v) if v is not None else 0 for v in pipe.execute()]
        group = rng.step_s // 60
        failures = [sum(per_minute[i : i + group]) for i in range(0, len(per_minute), group)]
        start_ms = first_minute * 60_000
    return Window(queue, rng, now_ms, since_ms, tasks, list(failures), start_ms)


def combined(windows: list[Window]) -> Window:
    """Several queues' windows of one range as one: failures added step by step (unknown where any is), and
    every queue's tasks, named ``<queue>: <task>``, busiest first; ``since_ms`` the latest of theirs."""
    if not windows:
        raise ValueError("nothing to combine")
    first = windows[0]
    failures: list[int | None] = []
    for i in range(len(first.failures)):
        values = [w.failures[i] if i < len(w.failures) else None for w in windows]
        failures.append(None if any(v is None for v in values) else sum(v for v in values if v is not None))
    tasks = [
        TaskFigures(f"{w.queue}: {t.task}", t.runs, t.failures, t.mean_ms, t.p50_ms, t.p95_ms)
        for w in windows
        for t in w.tasks
    ]
    tasks.sort(key=lambda t: (-t.runs, t.task))
    sinces = [w.since_ms for w in windows if w.since_ms is not None]
    return Window(
        "all",
        first.range,
        first.now_ms,
        max(sinces) if len(sinces) == len(windows) else None,
        tasks,
        failures,
        first.start_ms,
    )
