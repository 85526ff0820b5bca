"""The live parts of console pages, rendered from one reading.

A fragment is a run of top-level elements, each with an ``id`` and
``hx-swap-oob``: the websocket extension and the polling fallback both swap
each element into the page in place of the one with the same id. A page's
first paint holds placeholders with those ids (``parts/live_pending.html``):
reading the counter history on the request path made every page slow.

Fragments go to every tab watching a topic, whoever its user is: they hold
numbers, charts and worker names, never a button (buttons depend on the
user's permissions and live in the page around the fragment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.template.loader import render_to_string

from chasqui_core.flows import BatchStatus, UnknownBatch, read_status
from chasqui_core.models import Operation
from chasqui_core.services.common import redis_client

from .charts import Chart, peaks, series_chart
from .readings import RATE_SECONDS, QueueLive, Reading
from .topics import Topic

RANGE_CHOICES = (("1h", "1 hour"), ("24h", "24 hours"), ("7d", "7 days"))
"""The console's time ranges (engine/ops/history.py RANGES), as the picker shows them."""

FIVE_MINUTES = ("5 min ago", "4 min", "3 min", "2 min", "1 min", "now")
ONE_DAY = ("24 h ago", "18 h", "12 h", "6 h", "now")
DAY_BINS = 288
"""The 24-hour charts draw one point per 5 minutes: the peak minute of each."""


def fmt_rate(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


@dataclass(frozen=True, slots=True)
class Charts:
    retries: Chart
    retries_day: Chart
    depth: Chart
    throughput: Chart


def _spike_note(live: QueueLive) -> str:
    values = live.seconds.points["retried"][:-1]
    recent = values[-10:]
    before = values[:-10]
    now = sum(recent) / len(recent) if recent else 0.0
    base = sum(before) / len(before) if before else 0.0
    return f"Spike: {fmt_rate(now)} retries/s over the last 10 s, against {fmt_rate(base)}/s before."


def charts_for(live: QueueLive) -> Charts:
    """The charts of one queue, or of all of them (``live`` is then the sum)."""
    spike = live.spike("retried")
    retried = live.seconds.points["retried"]
    retries = series_chart(
        retried[:-1] + [None], title="Retries scheduled per second, last 5 minutes",
        value=f"{fmt_rate(live.rate('retried'))}/s", x_labels=FIVE_MINUTES, highlight_last=11, spike=spike,
        note=_spike_note(live) if spike else "",
    )
    day_spike = live.day_spike("retried")
    per_minute = live.minutes.points["retried"]
    retries_day = series_chart(
        peaks(per_minute, DAY_BINS), title="Retries scheduled per minute, last 24 hours",
        value=f"{live.day_total('retried'):,} in 24 h", x_labels=ONE_DAY, highlight_last=2, spike=day_spike,
        note="Spike: the last 5 minutes run well above the 2 hours before them." if day_spike else "",
    )
    known = [d for d in live.depth if d is not None]
    depth = series_chart(
        live.depth, title="Delayed set depth, last 5 minutes", value=f"{live.delayed:,}",
        x_labels=FIVE_MINUTES, minimum_max=10,
        note="" if len(known) > 1 else "Depth is sampled while a console page is open: history starts now.",
    )
    throughput = series_chart(
        live.seconds.points["completed"][:-1] + [None], title="Jobs completed per second, last 5 minutes",
        value=f"{fmt_rate(live.rate('completed'))}/s", x_labels=FIVE_MINUTES,
    )
    return Charts(retries, retries_day, depth, throughput)


def overview_context(reading: Reading) -> dict[str, Any]:
    return {
        "reading": reading,
        "total": reading.total,
        "queues": list(reading.queues.values()),
        "charts": charts_for(reading.total),
        "rate_seconds": RATE_SECONDS,
    }


def queue_context(reading: Reading, queue: str) -> dict[str, Any]:
    live = reading.queues[queue]
    return {
        "reading": reading,
        "q": live,
        "charts": charts_for(live),
        "workers": reading.workers_of(queue),
        "rate_seconds": RATE_SECONDS,
    }


def dlq_context(reading: Reading, queue: str) -> dict[str, Any]:
    live = reading.queues[queue]
    return {"reading": reading, "q": live, "rate_seconds": RATE_SECONDS}


def operation_context(op: Operation | None) -> dict[str, Any]:
    percent = 0
    if op is not None:
        if op.total:
            percent = min(100, round(op.done * 100 / op.total))
        elif op.finished:
            percent = 100
    return {"op": op, "percent": percent}


BATCH_CHILDREN_SHOWN = 500
"""Children listed on a workflow's page; the counts cover them all."""


def batch_context(status: BatchStatus | None) -> dict[str, Any]:
    """A workflow's figures, callbacks and first children (``status`` None: it expired since the page opened)."""
    if status is None:
        return {"batch": None}
    children = list(zip(status.children, status.states, status.child_results, strict=True))
    ended = status.total - status.pending
    return {"batch": status, "children": children[:BATCH_CHILDREN_SHOWN],
            "more": max(0, len(children) - BATCH_CHILDREN_SHOWN),
            "percent": 100 * ended // status.total if status.total else 100}


def read_batch(batch_id: str) -> BatchStatus | None:
    """A workflow's state now, for its topic's fragment (a read of its batches' hashes)."""
    try:
        return read_status(redis_client(), batch_id)
    except (UnknownBatch, ValueError):
        return None


TEMPLATES = {
    "overview": "chasqui_console/live/overview.html",
    "queue": "chasqui_console/live/queue.html",
    "dlq": "chasqui_console/live/dlq.html",
    "operation": "chasqui_console/live/operation.html",
    "batch": "chasqui_console/live/batch.html",
}


def context(topic: Topic, reading: Reading | None, operations: dict[str, Operation]) -> dict[str, Any]:
    if topic.kind == "overview":
        assert reading is not None
        return overview_context(reading)
    if topic.kind == "queue":
        assert reading is not None
        return queue_context(reading, topic.arg)
    if topic.kind == "dlq":
        assert reading is not None
        return dlq_context(reading, topic.arg)
    if topic.kind == "batch":
        return batch_context(read_batch(topic.arg))
    return operation_context(operations.get(topic.arg))


def render(topic: Topic, reading: Reading | None, operations: dict[str, Operation]) -> str:
    ctx = context(topic, reading, operations)
    ctx["oob"] = True
    return render_to_string(TEMPLATES[topic.kind], ctx)


HISTORY_LABELS = {
    "1h": ("1 h ago", "45 min", "30 min", "15 min", "now"),
    "24h": ("24 h ago", "18 h", "12 h", "6 h", "now"),
    "7d": ("7 days ago", "5 days", "3 days", "1 day", "now"),
}
STEP_WORDS = {60: "per minute", 900: "per 15 minutes", 3600: "per hour"}


def history_context(window: Any) -> dict[str, Any]:
    """The history panel of a queue: failures over the range and the per-task table (engine/ops/history.py)."""
    rng = window.range
    known = [v for v in window.failures if v is not None]
    chart = series_chart(
        window.failures, title=f"Failed runs {STEP_WORDS.get(rng.step_s, '')}, last {rng.label}",
        value=f"{sum(known):,} in {rng.label}", x_labels=HISTORY_LABELS[rng.name],
        note="" if len(known) == len(window.failures) else
        "Gaps: no worker took the hourly snapshots then.",
    )
    return {"history": window, "history_chart": chart, "ranges": RANGE_CHOICES}
