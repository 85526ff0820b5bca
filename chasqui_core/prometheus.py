"""Chasqui's figures in Prometheus's text format, read from Redis at scrape time.

The collector keeps no counters of its own: every value comes from Redis when
Prometheus asks, so any web process answers for the whole fleet and a
restarted process loses nothing. A scrape costs two round trips whatever the
number of queues: the queue registry, then one pipeline with the server's
clock and every queue's stats (``engine/ops/stats.py``), totals
(``engine/ops/totals.py``) and count of limit buckets; only a queue whose jobs
met a rate or concurrency limit costs one read more (``engine/worker/limits.py``),
and the queues with priority bands one round trip more for all of them
(``stats.add_bands``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from chasqui_core.engine.worker import limits
from chasqui_core.engine.timing import scheduler
from chasqui_core.engine.ops import stats, totals
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.timing.schedules import Schedule

PREFIX = "chasqui_"

_COUNTERS = (
    ("enqueued", "jobs_enqueued", "Jobs added to the queue, ready or delayed (duplicates refused by job id excluded)."),
    ("fetched", "jobs_fetched", "Entries workers read from the queue's streams (a job read again after a worker's "
     "death or a shutdown counts again)."),
    ("completed", "jobs_completed", "Handler runs that succeeded."),
    ("failed", "jobs_failed", "Handler runs that raised, whether the job was retried or dead-lettered."),
    ("retried", "jobs_retried", "Failed runs scheduled for another attempt."),
    ("dlq", "jobs_dead_lettered", "Jobs moved to the dead-letter queue, for any reason."),
    ("replayed", "jobs_replayed", "Dead-letter entries sent back to work by an operator."),
    ("promoted", "jobs_promoted", "Delayed jobs (retries included) moved to the stream when due."),
    ("skipped", "jobs_skipped", "Jobs acknowledged without running: their idempotency key had already completed."),
    ("bad_signature", "jobs_bad_signature",
     "Jobs refused because their signature was missing or wrong (also counted as dead-lettered)."),
    ("deferred", "jobs_deferred", "Jobs that waited in the delayed set for room in a rate or concurrency limit "
     "(each wait counted; no attempt charged)."),
    ("lost", "runs_lost", "Runs under way in a worker whose process died, taken back after the visibility timeout "
     "(each charged to its job as a death: two make a panic)."),
    ("lost_contact", "runs_lost_contact", "Runs under way in a worker that stopped answering with no death on "
     "record, taken back after the visibility timeout (charged as a run, never as a death)."),
    ("recovered", "jobs_recovered", "Jobs taken back from a worker that stopped answering before they started "
     "(no attempt charged)."),
    ("dlq_trimmed", "jobs_dlq_trimmed", "Dead-letter entries removed by the queue's retention rule, oldest first."),
    ("batches_started", "batches_started", "Workflow batches written (each step of a chain is one)."),
    ("batches_succeeded", "batches_succeeded", "Batches whose every child succeeded (on_success is due)."),
    ("batches_completed", "batches_completed", "Batches whose every child ended: succeeded, dead or discarded "
     "(on_complete is due)."),
    ("callbacks", "workflow_callbacks", "Callbacks and chain steps a batch's end enqueued (also counted as enqueued)."),
)

_BUCKET_BOUNDS = [floatToGoString(ms / 1000) for ms in totals.DURATION_BOUNDS_MS] + ["+Inf"]


class QueueCollector(Collector):
    """Every registered queue's depth, counters and run durations, in one pipelined read per scrape."""

    def __init__(self, client, *, stale_after_ms: int = stats.DEFAULT_STALE_AFTER_MS,
                 windows: dict[str, int] | None = None) -> None:
        self.client = client
        self.stale_after_ms = stale_after_ms
        self.windows = windows or {}
        """Each rate limit's window (ms) by scope, so its figure counts the current window's starts only."""

    def collect(self) -> Iterator[Metric]:
        all_keys = [QueueKeys.for_queue(name) for name in stats.list_queues(self.client)]
        pipe = self.client.pipeline(transaction=False)
        stats.add_clock_read(pipe, QUEUES_REGISTRY)
        for keys in all_keys:
            stats.add_stats_reads(pipe, keys)
            totals.add_reads(pipe, keys)
            pipe.scard(keys.limits)
        replies = pipe.execute(raise_on_error=False)
        now = stats.server_ms(replies[0])
        per_queue = stats.STATS_READS + totals.READS + 1

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=["queue"])

        depth = gauge("queue_stream_length", "Entries in the queue's stream (its priority bands' summed): jobs "
                      "waiting plus jobs leased to workers.")
        band_waiting = GaugeMetricFamily(PREFIX + "queue_band_waiting_jobs", "Jobs waiting in each priority band's "
                                         "stream (high, default, low), for queues that have priority bands.",
                                         labels=["queue", "band"])
        pending = gauge("queue_pending_jobs", "Jobs leased to a worker and not settled yet.")
        delayed = gauge("queue_delayed_jobs", "Jobs in the delayed set: scheduled for later, or waiting for a retry.")
        dlq = gauge("queue_dead_letter_jobs", "Entries in the dead-letter queue.")
        paused = gauge("queue_paused", "1 when operators paused the queue (workers do not read it), else 0.")
        workers = gauge("queue_workers_alive", "Workers whose heartbeat on this queue is fresh.")
        lag = gauge("promoter_lag_seconds",
                    "Age of the oldest due job still in the delayed set (0 when none is due): how late promotion is.")
        counters = {field: CounterMetricFamily(PREFIX + name, doc, labels=["queue"]) for field, name, doc in _COUNTERS}
        by_reason = CounterMetricFamily(PREFIX + "jobs_dead_lettered_by_reason", "Jobs moved to the dead-letter "
                                        "queue, per reason (panic, retries_exhausted, unrecoverable, ...).",
                                        labels=["queue", "reason"])
        durations = HistogramMetricFamily(
            PREFIX + "job_duration_seconds",
            "Run time of handler runs, successful or failed, per task (counted as whole milliseconds).",
            labels=["queue", "task"],
        )
        queue_stats = stats.add_bands(self.client, [
            stats.stats_from_replies(keys, replies[1 + per_queue * i:1 + per_queue * i + stats.STATS_READS], now,
                                     self.stale_after_ms) for i, keys in enumerate(all_keys)])
        for i, (keys, qs) in enumerate(zip(all_keys, queue_stats, strict=True)):
            start = 1 + per_queue * i
            counted = totals.parse(keys.queue, *replies[start + stats.STATS_READS:start + per_queue - 1])
            label = [keys.queue]
            depth.add_metric(label, qs.stream_length)
            pending.add_metric(label, qs.pending)
            delayed.add_metric(label, qs.delayed)
            dlq.add_metric(label, qs.dlq)
            paused.add_metric(label, 1 if qs.paused else 0)
            workers.add_metric(label, qs.workers)
            lag.add_metric(label, qs.oldest_overdue_age_ms / 1000)
            for band, waiting in qs.bands.items():
                band_waiting.add_metric([keys.queue, band], waiting)
            for field, family in counters.items():
                family.add_metric(label, counted.counters[field])
            for reason, n in counted.dead_lettered.items():
                by_reason.add_metric([keys.queue, reason], n)
            for task, histogram in counted.durations.items():
                cumulative, running = [], 0
                for bound, count in zip(_BUCKET_BOUNDS, histogram.counts, strict=False):
                    running += count
                    cumulative.append((bound, running))
                durations.add_metric([keys.queue, task], cumulative, histogram.sum_ms / 1000)
        yield from (depth, band_waiting, pending, delayed, dlq, paused, workers, lag, *counters.values(), by_reason,
                    durations)
        limited = [keys for i, keys in enumerate(all_keys) if replies[1 + per_queue * i + per_queue - 1]]
        yield from self.limit_figures(limited)

    def limit_figures(self, limited: list[QueueKeys]) -> Iterator[Metric]:
        """Each rate and concurrency limit in use, per queue: runs, starts in the window, jobs waiting for room.

        Summed over a limit's buckets (a keyed limit has one per key value, too
        many to label); the console lists the busiest buckets. Only queues
        whose jobs met a limit cost a read here.
        """
        labels = ["queue", "limit"]
        running = GaugeMetricFamily(PREFIX + "limit_running_jobs", "Concurrency slots held now.", labels=labels)
        waiting = GaugeMetricFamily(PREFIX + "limit_waiting_jobs", "Jobs waiting in the delayed set for room in the "
                                    "limit.", labels=labels)
        started = GaugeMetricFamily(PREFIX + "limit_window_starts", "Starts within the rate limit's current window.",
                                    labels=labels)
        for keys in limited:
            sums: dict[str, list[int]] = {}
            for b in limits.read_buckets(self.client, keys, self.windows):
                total = sums.setdefault(b.scope, [0, 0, 0])
                total[0] += b.running
                total[1] += b.waiting
                total[2] += b.started
            for scope, (r, w, n) in sums.items():
                running.add_metric([keys.queue, scope], r)
                waiting.add_metric([keys.queue, scope], w)
                started.add_metric([keys.queue, scope], n)
        yield from (running, waiting, started)


class ScheduleCollector(Collector):
    """Each schedule's fires, misses, next fire and pause, in one pipelined read per scrape."""

    def __init__(self, client, schedules: list[Schedule]) -> None:
        self.client = client
        self.schedules = schedules

    def collect(self) -> Iterator[Metric]:
        if not self.schedules:
            return
        states = scheduler.read_states(self.client, [s.name for s in self.schedules])
        labels = ["schedule", "queue"]
        fired = CounterMetricFamily(PREFIX + "schedule_fires", "Jobs added by the scheduler for the schedule's due "
                                    "times (fires by hand excluded).", labels=labels)
        missed = CounterMetricFamily(PREFIX + "schedule_missed", "Due times that got no job because no worker "
                                     "fired schedules then (by the misfire policy).", labels=labels)
        next_fire = GaugeMetricFamily(PREFIX + "schedule_next_fire_timestamp_seconds", "When the schedule fires "
                                      "next (absent while paused or before a scheduler first saw it); in the past "
                                      "when no worker fires schedules.", labels=labels)
        last_fire = GaugeMetricFamily(PREFIX + "schedule_last_fire_timestamp_seconds", "When the schedule last "
                                      "added a job.", labels=labels)
        paused = GaugeMetricFamily(PREFIX + "schedule_paused", "1 while the schedule is paused.", labels=labels)
        for schedule, state in zip(self.schedules, states, strict=True):
            values = [schedule.name, schedule.queue]
            fired.add_metric(values, state.fired)
            missed.add_metric(values, state.missed)
            paused.add_metric(values, 1 if state.paused else 0)
            if state.next_due is not None and not state.paused and state.version == schedule.version:
                next_fire.add_metric(values, state.next_due / 1000)
            if state.recent:
                last_fire.add_metric(values, state.recent[0].at / 1000)
        yield from (fired, missed, next_fire, last_fire, paused)


def render(client, schedules: list[Schedule] | None = None, windows: dict[str, int] | None = None) -> bytes:
    """The text exposition of every queue (and of the given schedules), read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(client, windows=windows))
    registry.register(ScheduleCollector(client, schedules or []))
    return generate_latest(registry)
