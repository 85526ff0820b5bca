"""Workers, as their heartbeats show them; their running jobs; quiet and stop."""

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import CHANGE, READ
from .schemas import RunningJobOut, RunningPageOut, WorkerCommandOut, WorkerListOut, WorkerOut, _dt
from chasqui_core.services import workers as workers_service

router = Router(tags=["workers"])


@router.get("", response={200: WorkerListOut, **READ}, summary="List workers", auth=needs("view_queues"))
def list_workers(
    request: HttpRequest,
    queue: str | None = Query(None, max_length=100, description="Only workers of this queue."),
    stale_after_ms: int = Query(10_000, ge=1, le=7 * 24 * 3600 * 1000,
                                       description="Heartbeats older than this mark the worker stale."),
):
    """Host, pid, queues, concurrency, in-flight, processed, last heartbeat and state of every worker;
    ``stale`` marks the ones that stopped beating. Needs view_queues."""
    found = workers_service.worker_list(request.auth, queue=queue or None, stale_after_ms=stale_after_ms)
    return WorkerListOut(items=[WorkerOut.from_info(w) for w in found])


@router.get("/{worker_id}", response={200: WorkerOut, **READ}, summary="One worker", auth=needs("view_queues"))
def get_worker(request: HttpRequest, worker_id: str):
    """One worker from its heartbeat; 404 when it has none. Needs view_queues."""
    return WorkerOut.from_info(workers_service.worker_detail(request.auth, worker_id))


@router.get("/{worker_id}/running", response={200: RunningPageOut, **READ}, summary="A worker's running jobs",
            auth=needs("view_queues"))
def worker_running(
    request: HttpRequest, worker_id: str,
    offset: int = Query(0, ge=0, description="Runs to skip (oldest first)."),
    limit: int = Query(50, ge=1, le=200),
):
    """Every run under way on the worker (from its start journals), oldest start first, paged: queue, entry,
    priority, task, job id and start. Needs view_queues."""
    page = workers_service.worker_running(request.auth, worker_id, offset=offset, limit=limit)
    return RunningPageOut(items=[RunningJobOut(queue=r.queue, entry_id=r.entry_id, priority=r.priority, task=r.task,
                                               job_id=r.job_id, started_at=_dt(r.started_at_ms)) for r in page.items],
                          total=page.total, offset=page.offset)


@router.post("/{worker_id}/quiet", response={200: WorkerCommandOut, **CHANGE}, summary="Quiet a worker",
             auth=needs("pause_queues"))
def quiet_worker(request: HttpRequest, worker_id: str):
    """The worker stops fetching within about a second; jobs it fetched and had not started go back on the
    stream, its running jobs finish and are settled. It keeps its heartbeat (state ``quiet``) until stopped.
    Needs pause_queues."""
    sent = workers_service.quiet(request.auth, worker_id, source="api")
    return WorkerCommandOut(worker=sent.worker.id, command="quiet", changed=sent.changed)


@router.post("/{worker_id}/stop", response={200: WorkerCommandOut, **CHANGE}, summary="Stop a worker",
             auth=needs("pause_queues"))
def stop_worker(request: HttpRequest, worker_id: str):
    """The worker shuts down as on SIGTERM, within about a second: its running jobs finish (up to its
    shutdown timeout), the jobs it fetched go back on the stream, then it exits. A worker started by a
    `runworker --processes` supervisor is not replaced. Needs pause_queues."""
    sent = workers_service.stop(request.auth, worker_id, source="api")
    return WorkerCommandOut(worker=sent.worker.id, command="stop", changed=sent.changed)
