"""Queues: live stats, metrics, pause and resume, purge."""

from typing import Literal

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import CHANGE, READ
from .schemas import (HistoryOut, LimitBucketOut, LimitListOut, LimitOut, MetricsOut, MetricsWindow, PurgeOut,
                      QueueListOut, QueueName, QueueStatsOut, SwitchOut, TaskFiguresOut, TotalsOut, _dt)
from chasqui_core.engine.ops.metrics import FIELDS
from chasqui_core.services import queues as queues_service

router = Router(tags=["queues"])


@router.get("", response={200: QueueListOut, **READ}, summary="List queues with live stats", auth=needs("view_queues"))
def list_queues(request: HttpRequest):
    """Every queue the backend serves or Redis knows, with stream length, pending, in-flight, delayed
    depth, overdue count and age, DLQ size and paused flag. Needs view_queues."""
    stats = queues_service.queue_overview(request.auth)
    return QueueListOut(items=[QueueStatsOut(**_stats(s)) for s in stats])


@router.get("/{queue}", response={200: QueueStatsOut, **READ}, summary="One queue's stats", auth=needs("view_queues"))
def get_queue(request: HttpRequest, queue: QueueName):
    """Live stats of one queue. Needs view_queues."""
    return QueueStatsOut(**_stats(queues_service.queue_detail(request.auth, queue)))


@router.post("/{queue}/pause", response={200: SwitchOut, **CHANGE}, summary="Pause a queue", auth=needs("pause_queues"))
def pause_queue(request: HttpRequest, queue: QueueName):
    """Workers stop reading the queue within a heartbeat; jobs keep arriving and nothing is lost.
    Needs pause_queues."""
    changed = queues_service.pause(request.auth, queue, source="api")
    return SwitchOut(queue=queue, paused=True, changed=changed)


@router.post("/{queue}/resume", response={200: SwitchOut, **CHANGE}, summary="Resume a queue",
             auth=needs("pause_queues"))
def resume_queue(request: HttpRequest, queue: QueueName):
    """Workers read the queue again. Needs pause_queues."""
    changed = queues_service.resume(request.auth, queue, source="api")
    return SwitchOut(queue=queue, paused=False, changed=changed)


@router.post("/{queue}/purge", response={200: PurgeOut, **CHANGE}, summary="Empty a queue's waiting jobs",
             auth=needs("discard_jobs"))
def purge_queue(request: HttpRequest, queue: QueueName):
    """Delete the queue's waiting jobs: those no worker was handed yet. Jobs a worker holds (running, or
    fetched and about to run), the delayed set and the DLQ are left alone; jobs added after the purge began
    are kept. Deleted jobs are counted as ``purged`` in the queue's totals. Needs discard_jobs."""
    return PurgeOut(queue=queue, purged=queues_service.purge(request.auth, queue, source="api"))


@router.get("/{queue}/metrics", response={200: MetricsOut, **READ}, summary="Counters over time",
            auth=needs("view_queues"))
def queue_metrics(
    request: HttpRequest,
    queue: QueueName,
    resolution: Literal["second", "minute"] = Query("second"),
    window: MetricsWindow | None = Query(None),
):
    """Per-second counters for the last hour (``resolution=second``, up to 3720 points) or per-minute
    for the last day (``resolution=minute``, up to 1500): enqueued, completed, failed, retried, dlq,
    promoted. ``window`` picks fewer points. Needs view_queues."""
    series = queues_service.queue_metrics(request.auth, queue, resolution=resolution, window=window)
    return MetricsOut(queue=series.queue, resolution=series.resolution, start_ms=series.start_ms,
                      step_ms=series.step_ms, fields=list(FIELDS), points=series.points)


@router.get("/{queue}/totals", response={200: TotalsOut, **READ}, summary="All-time counters",
            auth=needs("view_queues"))
def queue_totals(request: HttpRequest, queue: QueueName):
    """Every all-time counter of the queue, and its dead-lettered jobs per reason: what an operator needs to see
    that runs were lost or jobs taken back from a worker that stopped answering. Needs view_queues."""
    counted = queues_service.queue_totals(request.auth, queue)
    return TotalsOut(queue=counted.queue, counters=counted.counters, dead_lettered=counted.dead_lettered)


@router.get("/{queue}/limits", response={200: LimitListOut, **READ}, summary="Rate and concurrency limits",
            auth=needs("view_queues"))
def queue_limits(request: HttpRequest, queue: QueueName):
    """The queue's own limit and the task limits its jobs have met, each with what it holds now: runs
    (concurrency slots), starts within the rate's window and jobs waiting for room, in all and for the
    busiest buckets. Needs view_queues."""
    limits = queues_service.queue_limits(request.auth, queue)
    return LimitListOut(queue=queue, items=[
        LimitOut(scope=limit.scope, setting=limit.setting, running=limit.running, waiting=limit.waiting,
                 started=limit.started, buckets=[LimitBucketOut(bucket=b.bucket, running=b.running,
                                                                waiting=b.waiting, started=b.started)
                                                 for b in limit.buckets])
        for limit in limits])


@router.get("/{queue}/history", response={200: HistoryOut, **READ}, summary="Failures and run time per task",
            auth=needs("view_queues"))
def queue_history(request: HttpRequest, queue: QueueName, range: Literal["1h", "24h", "7d"] = Query("1h")):
    """Failed runs over the last hour (per minute), day (per 15 minutes) or week (per hour), and each task's
    runs, failures, mean and p50 / p95 run time since the range's start (read against the snapshot taken
    nearest after it: ``since``). Needs view_queues."""
    w = queues_service.queue_history(request.auth, queue, range=range)
    return HistoryOut(queue=w.queue, range=w.range.name, since=_dt(w.since_ms), step_seconds=w.range.step_s,
                      start=_dt(w.start_ms), failures=w.failures,
                      tasks=[TaskFiguresOut(task=t.task, runs=t.runs, failures=t.failures, mean_ms=round(t.mean_ms, 1),
                                            p50_ms=t.p50_ms, p95_ms=t.p95_ms) for t in w.tasks])


def _stats(s) -> dict:
    return {
        "name": s.name, "stream_length": s.stream_length, "pending": s.pending, "in_flight": s.in_flight,
        "delayed": s.delayed, "overdue": s.overdue, "oldest_overdue_age_ms": s.oldest_overdue_age_ms,
        "dlq": s.dlq, "paused": s.paused, "workers": s.workers, "lag": s.lag,
        "bands": dict(s.bands),
    }
