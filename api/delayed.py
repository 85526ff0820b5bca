"""The delayed set: scheduled jobs and retries waiting for their backoff."""

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import CHANGE, READ
from .schemas import CancelledOut, DelayedCursor, DelayedJobOut, DelayedPageOut, JobId, QueueName, RunNowOut
from chasqui_core.services import delayed as delayed_service
from chasqui_core.services.common import MAX_PAGE

router = Router(tags=["delayed"])


@router.get("/{queue}/delayed", response={200: DelayedPageOut, **READ}, summary="Page through delayed jobs",
            auth=needs("view_queues"))
def list_delayed(
    request: HttpRequest,
    queue: QueueName,
    cursor: DelayedCursor | None = Query(None, max_length=200, description="next_cursor of the previous page."),
    limit: int = Query(50, ge=1, le=MAX_PAGE, description="Items per page."),
):
    """Soonest first; pass ``next_cursor`` back as ``cursor`` for the next page. Needs view_queues."""
    page = delayed_service.delayed_page(request.auth, queue, cursor=cursor, limit=limit)
    return DelayedPageOut(items=[DelayedJobOut.from_job(j) for j in page.items], next_cursor=page.next_cursor)


@router.get("/{queue}/delayed/{job_id}", response={200: DelayedJobOut, **READ}, summary="One delayed job",
            auth=needs("view_queues"))
def get_delayed(request: HttpRequest, queue: QueueName, job_id: JobId):
    """Needs view_queues."""
    return DelayedJobOut.from_job(delayed_service.delayed_job(request.auth, queue, job_id))


@router.post("/{queue}/delayed/{job_id}/cancel", response={200: CancelledOut, **CHANGE},
             summary="Cancel a delayed job", auth=needs("discard_jobs"))
def cancel_delayed(request: HttpRequest, queue: QueueName, job_id: JobId):
    """Remove the job for good; 404 when it already ran or was cancelled. Needs discard_jobs."""
    delayed_service.cancel_delayed(request.auth, queue, job_id, source="api")
    return CancelledOut(job_id=job_id, cancelled=True)


@router.post("/{queue}/delayed/{job_id}/run-now", response={200: RunNowOut, **CHANGE},
             summary="Run a delayed job now", auth=needs("enqueue_jobs"))
def run_delayed_now(request: HttpRequest, queue: QueueName, job_id: JobId):
    """Move the job to the stream at once. Needs enqueue_jobs."""
    entry_id = delayed_service.run_delayed_now(request.auth, queue, job_id, source="api")
    return RunNowOut(job_id=job_id, entry_id=entry_id)
