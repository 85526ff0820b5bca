"""One reading of every queue's health, as the live console shows it.

The sampler takes a reading about once a second, so ``Reader`` keeps what it
read before: the per-second and per-minute counter buckets of the past do not
change, and only the newest couple of buckets are fetched again on each read.
A reading therefore costs a handful of pipelined round trips whatever the
window, through the engine's ``stats`` and ``metrics`` functions.

The all-time counters (``engine/ops/totals.py``: fetched, lost, recovered,
dead-lettered per reason...) are read whole on each reading, one HGETALL per
queue in one round trip: they are what tells an operator that workers died
under their runs, which the live rates cannot.

Delayed-set depth has no counter in Redis (it is a sorted set's size), so its
history is sampled: each reading adds the depth it saw to a small sorted set
next to the queue's keys (``QueueKeys.console_depth``, member
``"<second>:<depth>"``, score = epoch second, trimmed to the live window).
Kept in Redis rather than in memory, the history is shared by every server
process and survives a page reload; it has gaps where no console was watching.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from chasqui_core.engine.ops import stats as stats_mod
from chasqui_core.engine.ops import metrics as metrics_mod
from chasqui_core.engine.ops import totals as totals_mod
from chasqui_core.engine.ops.stats import QueueStats, WorkerInfo
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.ops.metrics import FIELDS, Series

SECOND_WINDOW = 300
"""Seconds in the live charts (the last 5 minutes)."""
MINUTE_WINDOW = 1440
"""Minutes in the day charts (the last 24 hours)."""
RATE_SECONDS = 10
"""Complete seconds averaged for a live rate, with the part of the current second already past: steady
enough to read, and quick to react (a first failure counts in the very reading that follows it)."""
REFETCH = 2
"""Newest buckets read again on every reading: they may still be filling."""
DEPTH_TTL = 2 * SECOND_WINDOW
"""Seconds a queue's depth history outlives its last sample."""


def _trimmed(series: Series) -> Series:
    """The series without its last bucket, which is still filling."""
    return Series(series.queue, series.resolution, series.start_ms, series.step_ms,
                  {name: values[:-1] for name, values in series.points.items()})


def summed(name: str, many: list[Series], resolution: str, window: int, start_ms: int, step_ms: int) -> Series:
    points = {f: [0] * window for f in FIELDS}
    for s in many:
        for f in FIELDS:
            target, source = points[f], s.points[f]
            for i, value in enumerate(source):
                target[i] += value
    return Series(name, resolution, start_ms, step_ms, points)


@dataclass(frozen=True, slots=True)
class QueueLive:
    """A queue's stats plus its recent history; also used for the sum of all queues."""

    name: str
    stats: QueueStats | None
    """None for the sum of all queues."""
    seconds: Series
    """SECOND_WINDOW one-second buckets, oldest first; the last one is still filling."""
    minutes: Series
    """MINUTE_WINDOW one-minute buckets, oldest first; the last one is still filling."""
    depth: list[int | None]
    """Delayed-set depth at each second of ``seconds`` (None where no sample was taken)."""
    stream_length: int = 0
    pending: int = 0
    delayed: int = 0
    oldest_overdue_age_ms: int = 0
    dlq: int = 0
    workers: int = 0
    paused: bool = False
    now_ms: int = 0
    """The server's clock at the reading: how much of the newest (filling) second has passed."""
    totals: totals_mod.QueueTotals | None = None
    """The all-time counters and dead letters per reason (summed over the queues for the total)."""

    def rate(self, counter: str) -> float:
        """Events per second over the last RATE_SECONDS complete seconds and the part of this one already past.

        The filling second counts with its elapsed fraction in the divisor, so a
        steady rate reads the same at any point of a second, and an event counted
        this second shows now rather than once the second is over.
        """
        values = self.seconds.points[counter][-RATE_SECONDS - 1:]
        if not values:
            return 0.0
        elapsed = (self.now_ms % 1000) / 1000 if self.now_ms else 0.0
        return sum(values) / (len(values) - 1 + elapsed) if len(values) - 1 + elapsed > 0 else 0.0

    def total(self, counter: str) -> int:
        """Events in the live window (the last 5 minutes)."""
        return sum(self.seconds.points[counter])

    def day_total(self, counter: str) -> int:
        return sum(self.minutes.points[counter])

    def spike(self, counter: str = "retried") -> bool:
        """The counter runs well above its baseline in the last ten seconds (see ``metrics.spike``)."""
        return metrics_mod.spike(_trimmed(self.seconds), counter, recent=10, baseline=SECOND_WINDOW - 11)

    def day_spike(self, counter: str = "retried") -> bool:
        """The counter's last 5 minutes run well above the 2 hours before them."""
        return metrics_mod.spike(_trimmed(self.minutes), counter, recent=5, baseline=120, min_rate=5.0)


@dataclass(frozen=True, slots=True)
class Reading:
    now_ms: int
    """The Redis server's clock when the reading was taken."""
    queues: dict[str, QueueLive]
    """By queue name, sorted."""
    total: QueueLive
    workers: list[WorkerInfo]
    """Every known worker, stale ones flagged."""

    def workers_of(self, queue: str) -> list[WorkerInfo]:
        return [w for w in self.workers if queue in w.queues]


@dataclass(slots=True)
class _Buckets:
    """Counter buckets of one resolution, by bucket number, per queue."""

    resolution: str
    window: int
    step_ms: int
    data: dict[str, dict[int, dict[str, int]]] = field(default_factory=dict)
    last: int | None = None
    """Newest bucket number read so far."""

    def update(self, client, queues: list[str], now_ms: int) -> dict[str, Series]:
        newest = now_ms // self.step_ms
        first = newest - self.window + 1
        missing = [q for q in queues if q not in self.data]
        if self.last is None or missing or not 0 <= newest - self.last < self.window:
            start = first  # first reading, a new queue, a long pause, or a server clock that went back
        else:
            start = max(first, self.last - REFETCH + 1)
        span = newest - start + 1
        fresh = metrics_mod.multi_series(client, queues, resolution=self.resolution, window=span, now_ms=now_ms)
        for name, s in fresh.items():
            buckets = self.data.setdefault(name, {})
            for i in range(span):
                buckets[start + i] = {f: s.points[f][i] for f in FIELDS}
            for old in [b for b in buckets if b < first]:
                del buckets[old]
        for gone in [q for q in self.data if q not in fresh]:
            del self.data[gone]
        self.last = newest
        out = {}
        for name in queues:
            buckets = self.data[name]
            points = {f: [buckets.get(b, {}).get(f, 0) for b in range(first, newest + 1)] for f in FIELDS}
            out[name] = Series(name, self.resolution, first * self.step_ms, self.step_ms, points)
        return out


class Reader:
    """Takes readings, keeping the counter buckets already read between them. Thread-safe."""

    def __init__(self, client) -> None:
        self.client = client
        self._seconds = _Buckets("second", SECOND_WINDOW, 1000)
        self._minutes = _Buckets("minute", MINUTE_WINDOW, 60_000)
        self._lock = threading.Lock()

    def read(self, queues: list[str]) -> Reading:
        queues = sorted(set(queues))
        with self._lock:
            seconds_now, micros = self.client.time()
            now_ms = int(seconds_now) * 1000 + int(micros) // 1000
            stats = {s.name: s for s in stats_mod.all_queue_stats(self.client, queues)}
            per_second = self._seconds.update(self.client, queues, now_ms) if queues else {}
            per_minute = self._minutes.update(self.client, queues, now_ms) if queues else {}
            workers = stats_mod.workers(self.client)
            newest = now_ms // 1000
            first = newest - SECOND_WINDOW + 1
            depths = self._sample_depth(queues, stats, first, newest)
            counted = totals_mod.read_totals(self.client, queues) if queues else {}
            live: dict[str, QueueLive] = {}
            for name in queues:
                st = stats[name]
                samples = depths[name]
                live[name] = QueueLive(
                    name, st, per_second[name], per_minute[name],
                    [samples.get(s) for s in range(first, newest + 1)],
                    stream_length=st.stream_length, pending=st.pending, delayed=st.delayed,
                    oldest_overdue_age_ms=st.oldest_overdue_age_ms, dlq=st.dlq, workers=st.workers,
                    paused=st.paused, now_ms=now_ms, totals=counted[name],
                )
        return Reading(now_ms, live, _total(live, now_ms, workers), workers)


    def _sample_depth(self, queues: list[str], stats: dict[str, QueueStats], first: int,
                      newest: int) -> dict[str, dict[int, int]]:
        """Record this reading's depths and read back each queue's history, in one round trip."""
        if not queues:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for name in queues:
            key = QueueKeys.for_queue(name).console_depth
            pipe.zadd(key, {f"{newest}:{stats[name].delayed}": newest})
            pipe.zremrangebyscore(key, "-inf", first - 1)
            pipe.expire(key, DEPTH_TTL)
            pipe.zrangebyscore(key, first, newest)
        replies = pipe.execute()
        out: dict[str, dict[int, int]] = {}
        for i, name in enumerate(queues):
            samples: dict[int, int] = {}
            for member in replies[4 * i + 3]:
                second, _, depth = (member.decode() if isinstance(member, bytes) else member).partition(":")
                try:
                    sec, value = int(second), int(depth)
                except ValueError:
                    continue
                samples[sec] = max(value, samples.get(sec, 0))  # two processes may sample the same second
            out[name] = samples
        return out


def _total(live: dict[str, QueueLive], now_ms: int, workers: list[WorkerInfo]) -> QueueLive:
    newest_s, newest_m = now_ms // 1000, now_ms // 60_000
    first_s, first_m = newest_s - SECOND_WINDOW + 1, newest_m - MINUTE_WINDOW + 1
    items = list(live.values())
    seconds = summed("all", [q.seconds for q in items], "second", SECOND_WINDOW, first_s * 1000, 1000)
    minutes = summed("all", [q.minutes for q in items], "minute", MINUTE_WINDOW, first_m * 60_000, 60_000)
    depth: list[int | None] = []
    for i in range(SECOND_WINDOW):
        values = [q.depth[i] for q in items if q.depth[i] is not None]
        depth.append(sum(values) if values else None)
    live_workers = sum(1 for w in workers if not w.stale)  # once each, whatever its queues
    return QueueLive(
        "all", None, seconds, minutes, depth,
        stream_length=sum(q.stream_length for q in items), pending=sum(q.pending for q in items),
        delayed=sum(q.delayed for q in items),
        oldest_overdue_age_ms=max((q.oldest_overdue_age_ms for q in items), default=0),
        dlq=sum(q.dlq for q in items), workers=live_workers, paused=False, now_ms=now_ms,
        totals=summed_totals([q.totals for q in items if q.totals is not None]),
    )


def summed_totals(many: list[totals_mod.QueueTotals]) -> totals_mod.QueueTotals:
    """The all-time counters and dead letters per reason of several queues, added up (durations left out)."""
    counters = dict.fromkeys(totals_mod.FIELDS, 0)
    reasons: dict[str, int] = {}
    for t in many:
        for name, n in t.counters.items():
            counters[name] = counters.get(name, 0) + n
        for reason, n in t.dead_lettered.items():
            reasons[reason] = reasons.get(reason, 0) + n
    return totals_mod.QueueTotals("all", counters, {}, dict(sorted(reasons.items())))
