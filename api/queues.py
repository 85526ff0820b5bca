"""Queues: live stats, metrics, pause and resume."""

from typing import Literal

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import CHANGE, READ
from .schemas import LimitBucketOut, LimitListOut, LimitOut, MetricsOut, QueueListOut, QueueStatsOut, SwitchOut
from chasqui_core.engine.metrics import FIELDS
from chasqui_core.services import queues as queues_service

router = Router(tags=["queues"])


@router.get("", response={200: QueueListOut, **READ}, summary="List queues with live stats", auth=needs("view_queues"))
def list_queues(request: HttpRequest):
    """Every queue the backend serves or Redis knows, with stream length, pending, in-flight, delayed
    depth, overdue count and age, DLQ size and paused flag. Needs view_queues."""
    stats = queues_service.queue_overview(request.auth)
    return QueueListOut(items=[QueueStatsOut(**_stats(s)) for s in stats])


@router.get("/{queue}", response={200: QueueStatsOut, **READ}, summary="One queue's stats", auth=needs("view_queues"))
def get_queue(request: HttpRequest, queue: str):
    """Live stats of one queue. Needs view_queues."""
    return QueueStatsOut(**_stats(queues_service.queue_detail(request.auth, queue)))


@router.post("/{queue}/pause", response={200: SwitchOut, **CHANGE}, summary="Pause a queue", auth=needs("pause_queues"))
def pause_queue(request: HttpRequest, queue: str):
    """Workers stop reading the queue within a heartbeat; jobs keep arriving and nothing is lost.
    Needs pause_queues."""
    changed = queues_service.pause(request.auth, queue, source="api")
    return SwitchOut(queue=queue, paused=True, changed=changed)


@router.post("/{queue}/resume", response={200: SwitchOut, **CHANGE}, summary="Resume a queue",
             auth=needs("pause_queues"))
def resume_queue(request: HttpRequest, queue: str):
    """Workers read the queue again. Needs pause_queues."""
    changed = queues_service.resume(request.auth, queue, source="api")
    return SwitchOut(queue=queue, paused=False, changed=changed)


@router.get("/{queue}/metrics", response={200: MetricsOut, **READ}, summary="Counters over time",
            auth=needs("view_queues"))
def queue_metrics(
    request: HttpRequest,
    queue: str,
    resolution: Literal["second", "minute"] = Query("second"),
    window: int | None = Query(None, ge=1, le=3720, description="Number of points (default: an hour or a day)."),
):
    """Per-second counters for the last hour (``resolution=second``, up to 3720 points) or per-minute
    for the last day (``resolution=minute``, up to 1500): enqueued, completed, failed, retried, dlq,
    promoted. ``window`` picks fewer points. Needs view_queues."""
    series = queues_service.queue_metrics(request.auth, queue, resolution=resolution, window=window)
    return MetricsOut(queue=series.queue, resolution=series.resolution, start_ms=series.start_ms,
                      step_ms=series.step_ms, fields=list(FIELDS), points=series.points)


@router.get("/{queue}/limits", response={200: LimitListOut, **READ}, summary="Rate and concurrency limits",
            auth=needs("view_queues"))
def queue_limits(request: HttpRequest, queue: str):
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


def _stats(s) -> dict:
    return {
        "name": s.name, "stream_length": s.stream_length, "pending": s.pending, "in_flight": s.in_flight,
        "delayed": s.delayed, "overdue": s.overdue, "oldest_overdue_age_ms": s.oldest_overdue_age_ms,
        "dlq": s.dlq, "paused": s.paused, "workers": s.workers, "lag": s.lag,
    }
