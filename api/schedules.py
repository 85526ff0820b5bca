"""Schedules: their timing and recent fires; pause, resume, run now."""

from django.http import HttpRequest
from ninja import Router

from .auth import needs
from .errors import CHANGE, READ
from .schedule_schemas import FireOut, ScheduleListOut, ScheduleOut, ScheduleSwitchOut
from chasqui_core.services import schedules as schedules_service

router = Router(tags=["schedules"])


@router.get("", response={200: ScheduleListOut, **READ}, summary="List schedules", auth=needs("view_queues"))
def list_schedules(request: HttpRequest):
    """Every schedule in settings.CHASQUI['SCHEDULES'] with its next fire, its recent fires and how each job
    went, and whether it is paused. Needs view_queues."""
    return ScheduleListOut(items=[ScheduleOut.from_info(s) for s in schedules_service.schedule_list(request.auth)])


@router.get("/{name}", response={200: ScheduleOut, **READ}, summary="One schedule", auth=needs("view_queues"))
def get_schedule(request: HttpRequest, name: str):
    """One schedule with its state. Needs view_queues."""
    return ScheduleOut.from_info(schedules_service.schedule_detail(request.auth, name))


@router.post("/{name}/pause", response={200: ScheduleSwitchOut, **CHANGE}, summary="Pause a schedule",
             auth=needs("pause_queues"))
def pause_schedule(request: HttpRequest, name: str):
    """Due times pass without a job until the schedule is resumed (they are not caught up). Needs pause_queues."""
    changed = schedules_service.pause(request.auth, name, source="api")
    return ScheduleSwitchOut(schedule=name, paused=True, changed=changed)


@router.post("/{name}/resume", response={200: ScheduleSwitchOut, **CHANGE}, summary="Resume a schedule",
             auth=needs("pause_queues"))
def resume_schedule(request: HttpRequest, name: str):
    """The schedule fires again from its next due time. Needs pause_queues."""
    changed = schedules_service.resume(request.auth, name, source="api")
    return ScheduleSwitchOut(schedule=name, paused=False, changed=changed)


@router.post("/{name}/run", response={200: FireOut, **CHANGE}, summary="Run a schedule's job now",
             auth=needs("enqueue_jobs"))
def run_schedule(request: HttpRequest, name: str):
    """Adds one job of the schedule now, with its arguments and retry settings; the timing does not move.
    Needs enqueue_jobs."""
    return FireOut.from_info(schedules_service.run_now(request.auth, name, source="api"))
