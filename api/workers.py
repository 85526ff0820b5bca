"""Workers, as their heartbeats show them."""

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import READ
from .schemas import WorkerListOut, WorkerOut
from chasqui_core.services import workers as workers_service

router = Router(tags=["workers"])


@router.get("", response={200: WorkerListOut, **READ}, summary="List workers", auth=needs("view_queues"))
def list_workers(
    request: HttpRequest,
    queue: str | None = Query(None, max_length=100, description="Only workers of this queue."),
    stale_after_ms: int = Query(10_000, ge=1, le=7 * 24 * 3600 * 1000,
                                       description="Heartbeats older than this mark the worker stale."),
):
    """Host, pid, queues, concurrency, in-flight, processed and last heartbeat of every worker;
    ``stale`` marks the ones that stopped beating. Needs view_queues."""
    found = workers_service.worker_list(request.auth, queue=queue or None, stale_after_ms=stale_after_ms)
    return WorkerListOut(items=[WorkerOut.from_info(w) for w in found])
