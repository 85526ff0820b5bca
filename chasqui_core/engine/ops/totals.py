"""All-time counters and run-duration histograms of a queue.

The time-bucketed counters (``metrics.py``) expire: they answer "how many per
second lately". A monitoring system wants counters that only grow, so it can
compute rates itself over any window and any process can answer for the whole
fleet. The Lua calls that bump the buckets therefore also bump one hash per
queue, ``<metrics>total``, in the same atomic call: the totals never disagree
with the jobs they count.

Run durations go to ``<metrics>durations`` as a histogram per task. Counting
each run with its own increment would cost Redis one command per job; the
settler instead counts a batch's runs per (task, bucket) in the worker and
``settle.lua`` adds each count with one HINCRBY, so a batch of 500 runs of one
task costs a handful of increments. A field is ``<upper bound in ms>:<task>``
(``inf:<task>`` above the last bound) or ``sum:<task>`` (milliseconds run),
readable with ``redis-cli hgetall``. Counting starts with the version that
introduced these keys; jobs settled before it are not in them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys

FIELDS = ("enqueued", "fetched", "completed", "failed", "retried", "dlq", "replayed", "promoted", "skipped",
          "bad_signature", "deferred", "purged", "lost", "lost_contact", "recovered", "dlq_trimmed",
          "batches_started", "batches_succeeded", "batches_completed", "callbacks")
"""The counters of ``<metrics>total``; ``fetched`` counts entries workers read from the streams, ``failed`` handler
runs that raised (retried or dead), ``skipped`` jobs acknowledged without running because their idempotency key had
completed, ``bad_signature`` jobs refused for a missing or wrong signature (also counted in ``dlq``), ``deferred``
jobs put back in the delayed set to wait for room in a rate or concurrency limit (each wait counted), ``purged``
waiting jobs an operator deleted (purge.py), ``lost`` runs under way in a worker whose process died (reclaim.lua:
each is charged to its job as a death), ``lost_contact`` runs under way in a worker that stopped answering with no
death on record (charged as a run, never as a death), ``recovered`` entries taken back from such a worker before
they started (uncharged), ``dlq_trimmed`` dead jobs a DLQ's retention rule removed (dlq/retention.py); of workflows
(flows/), ``batches_started`` batches written (a chain's steps each), ``batches_succeeded`` batches whose every
child succeeded, ``batches_completed`` batches whose every child ended (succeeded, dead or discarded), ``callbacks``
callbacks and chain steps a batch's end enqueued (also counted in ``enqueued``)."""
DLQ_REASON_PREFIX = "dlq:"
"""``dlq:<reason>`` counts the jobs dead-lettered for that reason (``dlq`` counts them all)."""

DURATION_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000)
"""Upper bounds of the histogram's buckets: a run of d ms falls in the first bucket with d <= bound."""

_BUCKET_NAMES = tuple(str(b) for b in DURATION_BOUNDS_MS) + ("inf",)
FAILURES = "fail"
"""``fail:<task>`` in the durations hash counts the task's runs that raised (retried or dead)."""
_POSITION = {name: i for i, name in enumerate(_BUCKET_NAMES)}

READS = 2
"""Commands ``add_reads`` queues per queue."""


@dataclass(frozen=True, slots=True)
class DurationHistogram:
    task: str
    counts: tuple[int, ...]
    """Runs per bucket, not cumulative: one per bound of DURATION_BOUNDS_MS, then the runs above the last."""
    sum_ms: int
    failures: int = 0
    """Runs that raised, among ``count``."""

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class QueueTotals:
    queue: str
    counters: dict[str, int]
    """Every field of FIELDS, 0 when never counted."""
    durations: dict[str, DurationHistogram]
    """By task name, for the tasks that ran at least once."""
    dead_lettered: dict[str, int] = field(default_factory=dict)
    """Jobs dead-lettered per reason (``panic``, ``retries_exhausted``...), for the reasons met at least once."""


def duration_increments(
    tasks: list[str], durations_ms: list[int], failed_tasks: Sequence[str] = ()
) -> list[str | int]:
    """The histogram increments of one batch of runs, laid flat for settle.lua: field, amount, field, amount...

    ``tasks[i]`` ran for ``durations_ms[i]``. This runs for every job a
    worker settles, so the per-job step is one C-level pass (a Counter of
    (task, milliseconds) pairs: a batch holds few distinct ones); the bucket
    of each distinct duration is then found once. ``failed_tasks`` names the
    task of each run that raised (also among ``tasks``): they are counted in
    ``fail:<task>``, so failures per task come with the same increments.
    """
    if not tasks:
        return []
    per_task: dict[str, dict[str, int]] = {}
    sums: dict[str, int] = {}
    for (task, ms), runs in Counter(zip(tasks, durations_ms, strict=True)).items():
        position = bisect_left(DURATION_BOUNDS_MS, ms)
        name = _BUCKET_NAMES[position]
        buckets = per_task.setdefault(task, {})
        buckets[name] = buckets.get(name, 0) + runs
        sums[task] = sums.get(task, 0) + ms * runs
    out: list[str | int] = []
    for task, buckets in per_task.items():
        for name in _BUCKET_NAMES:
            if name in buckets:
                out += (f"{name}:{task}", buckets[name])
        out += (f"sum:{task}", sums[task])
    if failed_tasks:
        for task, failures in Counter(failed_tasks).items():
            out += (f"{FAILURES}:{task}", failures)
    return out


def add_reads(pipe: Client, keys: QueueKeys) -> None:
    """Queue the READS commands that read one queue's totals on ``pipe``; parse their replies with ``parse``."""
    pipe.hgetall(keys.totals)
    pipe.hgetall(keys.durations)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def parse(queue: str, counters_reply: dict[bytes, bytes], durations_reply: dict[bytes, bytes]) -> QueueTotals:
    """A queue's totals from the replies of ``add_reads``; fields this version does not know are left out."""
    for reply in (counters_reply, durations_reply):
        if isinstance(reply, Exception):  # a pipeline read with raise_on_error=False
            raise reply
    counters = dict.fromkeys(FIELDS, 0)
    dead_lettered: dict[str, int] = {}
    for name, value in counters_reply.items():
        counter = _text(name)
        if counter in counters:
            counters[counter] = int(value)
        elif counter.startswith(DLQ_REASON_PREFIX) and len(counter) > len(DLQ_REASON_PREFIX):
            dead_lettered[counter[len(DLQ_REASON_PREFIX):]] = int(value)
    return QueueTotals(queue, counters, histograms(durations_reply), dict(sorted(dead_lettered.items())))


def histograms(fields: dict[bytes, bytes] | dict[str, int]) -> dict[str, DurationHistogram]:
    """Per-task histograms from the fields of a durations hash (or a difference of two); unknown fields left out."""
    counts: dict[str, list[int]] = {}
    sums: dict[str, int] = {}
    failures: dict[str, int] = {}
    for name, value in fields.items():
        bucket, _, task = _text(name).partition(":")
        if bucket == "sum":
            sums[task] = int(value)
        elif bucket == FAILURES:
            failures[task] = int(value)
        elif bucket in _POSITION:
            counts.setdefault(task, [0] * len(_BUCKET_NAMES))[_POSITION[bucket]] = int(value)
    return {
        task: DurationHistogram(
            task, tuple(counts.get(task, [0] * len(_BUCKET_NAMES))), sums.get(task, 0), failures.get(task, 0)
        )
        for task in sorted(set(counts) | set(sums))
    }


def read_totals(client: Client, queues: list[str]) -> dict[str, QueueTotals]:
    """The totals of several queues, in one round trip."""
    all_keys = [QueueKeys.for_queue(q) for q in dict.fromkeys(queues)]
    pipe = client.pipeline(transaction=False)
    for keys in all_keys:
        add_reads(pipe, keys)
    replies = pipe.execute()
    return {k.queue: parse(k.queue, replies[READS * i], replies[READS * i + 1]) for i, k in enumerate(all_keys)}
