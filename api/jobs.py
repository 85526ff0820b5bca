"""Jobs: enqueue a project task by name, find a job in any state, cancel one, list the tasks."""

from typing import Literal

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status

from .auth import needs
from .errors import CHANGE, READ, WITH_BODY
from .schemas import CancelJobOut, EnqueueIn, EnqueueOut, JobId, JobOut, QueueName, TaskOut, _dt
from chasqui_core.services import jobs as jobs_service

router = Router(tags=["jobs"])


@router.get("/tasks", response={200: list[TaskOut], **READ}, summary="List the tasks that can be enqueued",
            auth=needs("view_queues"))
def list_tasks(request: HttpRequest):
    """The project's Django tasks by module path, with their default queue. Needs view_queues."""
    return [TaskOut(name=t.name, queue=t.queue, max_attempts=t.max_attempts, parameters=t.parameters)
            for t in jobs_service.task_list(request.auth)]


@router.post("/queues/{queue}/jobs", response={201: EnqueueOut, **WITH_BODY}, summary="Enqueue a task",
             auth=needs("enqueue_jobs"))
def enqueue(request: HttpRequest, queue: QueueName, payload: EnqueueIn):
    """Enqueue a registered task by name, with args, kwargs and per-job options (delay, attempts,
    backoff, job_id, priority). Arguments must fit the task's signature. Needs enqueue_jobs."""
    result = jobs_service.enqueue(
        request.auth, queue, payload.task, payload.args, payload.kwargs, delay_ms=payload.delay_ms,
        attempts=payload.attempts, backoff=payload.backoff, job_id=payload.job_id, priority=payload.priority,
        source="api",
    )
    return Status(201, EnqueueOut(job_id=result.id, queue=result.task.queue_name, task=result.task.module_path,
                                  status=str(result.status), run_after=result.task.run_after))


@router.get("/jobs/{job_id}", response={200: JobOut, **READ}, summary="Find a job in any state",
            auth=needs("view_queues"))
def find_job(request: HttpRequest, job_id: JobId, search: Literal["near", "all"] = "near"):
    """Where a job is and what it holds: waiting, running, delayed, dead, or finished (while result storage
    keeps it). ``search=near`` (the default) reads only where the id leads, in milliseconds however many jobs
    the queues hold; ``search=all`` also reads every stream and delayed set whole (seconds at a million). 404
    says where it looked, and what it left unread. Arguments, errors and results are masked. Needs view_queues."""
    try:
        return JobOut.from_lookup(jobs_service.find_job(request.auth, job_id, wide=search == "all"))
    except jobs_service.NotFoundNearby as exc:
        raise jobs_service.NotFoundNearby(f"{exc} Ask again with ?search=all to read every place whole.") from None


@router.post("/jobs/{job_id}/cancel", response={202: CancelJobOut, **CHANGE}, summary="Cancel a job",
             auth=needs("discard_jobs"))
def cancel_job(request: HttpRequest, job_id: JobId):
    """Cancel a waiting, delayed or running job: a waiting or delayed one never runs, a running async one is
    cancelled within a second, a running sync one is told and given up after the worker's grace. It ends in
    the dead-letter queue with reason ``cancelled``. 202: asked for, the workers act on it; 409 when the job
    is dead or finished already. Needs discard_jobs."""
    done = jobs_service.cancel_job(request.auth, job_id, source="api")
    return Status(202, CancelJobOut(job_id=done.job_id, queue=done.queue, state=done.state,
                                    requested_at=_dt(done.requested_ms), moved_from_delayed=done.moved_from_delayed))
