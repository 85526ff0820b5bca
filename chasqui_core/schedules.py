"""Schedules from ``settings.CHASQUI["SCHEDULES"]``, resolved against the project's tasks.

The engine knows how to time and fire a schedule (engine/timing/schedules.py,
engine/timing/scheduler.py); this module says which task each one runs, checks that
the task exists and runs on a Chasqui backend, and adds each fire's job
through the task itself, so a fired job is enqueued like any other (signals,
the backend's result storage, the outbox when it is on).

Checked at start: ``manage.py check`` and every ``runworker`` report a
schedule naming an unknown task, a bad cron expression or both/neither of
``cron`` and ``every``, with the schedule's name.
"""

from __future__ import annotations

from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.tasks import Task
from django.utils.module_loading import import_string

from chasqui_core.backend import ChasquiBackend
from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.timing.schedules import Schedule, ScheduleError, parse_schedule
from chasqui_core.task import TASK_REGISTRY, ChasquiTask, discover_tasks

WHERE = "settings.CHASQUI['SCHEDULES']"

_configured: dict[str, Schedule] | None = None


def configured() -> dict[str, Schedule]:
    """Every schedule of the settings, checked; raises ImproperlyConfigured naming the first bad one."""
    global _configured
    if _configured is None:
        out = {}
        for name, raw in chasqui_settings().SCHEDULES.items():
            try:
                task = resolve_task(name, raw.get("task"))
                out[name] = parse_schedule(name, {**raw, "task": task.module_path}, default_queue=task.queue_name,
                                           where=WHERE)
                task.using(queue_name=out[name].queue)  # the backend serves that queue
            except ScheduleError as exc:
                raise ImproperlyConfigured(str(exc)) from None
            except Exception as exc:  # the task framework's own checks (an unserved queue...)
                raise ImproperlyConfigured(f"{WHERE}[{name!r}]: {exc}") from None
        _configured = out
    return _configured


def check_schedules(app_configs: object = None, **kwargs: object) -> list[Error]:
    """The system check (registered by the app): one error for the first bad schedule."""
    try:
        chasqui_settings()
    except ImproperlyConfigured:
        return []  # settings.CHASQUI itself is wrong: the task backend's check says so (chasqui.E001)
    try:
        configured()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="chasqui.E002")]
    return []


def resolve_task(name: str, path: object) -> ChasquiTask:
    """The task a schedule names by dotted path: the project's own, on a Chasqui backend."""
    label = f"{WHERE}[{name!r}]"
    if not isinstance(path, str) or not path:
        raise ScheduleError(f"{label}['task'] must be the dotted path of a task, e.g. 'reports.tasks.nightly'")
    discover_tasks()
    task = TASK_REGISTRY.get(path)
    if task is None:
        try:
            found = import_string(path)
        except ImportError as exc:
            raise ScheduleError(f"{label}['task'] is {path!r}, which is not a task of this project ({exc})") from None
        if not isinstance(found, Task):
            raise ScheduleError(f"{label}['task'] is {path!r}, which is not a task: decorate the function with "
                                "@task (django.tasks.task)")
        if not isinstance(found, ChasquiTask):
            raise ScheduleError(f"{label}['task'] is {path!r}, which runs on backend {found.backend!r}; schedules "
                                "fire tasks of a Chasqui backend only")
        task = found
    if not isinstance(task.get_backend(), ChasquiBackend):
        raise ScheduleError(f"{label}['task'] is {path!r}, which runs on backend {task.backend!r}; schedules fire "
                            "tasks of a Chasqui backend only")
    return task


def _task_for(schedule: Schedule, job_id: str) -> ChasquiTask:
    task = resolve_task(schedule.name, schedule.task)
    return task.using(queue_name=schedule.queue, attempts=schedule.attempts, backoff=schedule.backoff, job_id=job_id,
                      result_ttl=schedule.result_ttl)


def fire(schedule: Schedule, job_id: str) -> None:
    """Add a job of the schedule now, through its task (a fire by hand)."""
    _task_for(schedule, job_id).enqueue(*schedule.args, **schedule.kwargs)


async def afire(schedule: Schedule, due_ms: int, job_id: str) -> None:
    """Add one fire's job through its task (the scheduler's Fire); with the same id, adds nothing."""
    await _task_for(schedule, job_id).aenqueue(*schedule.args, **schedule.kwargs)


def _settings_changed(*, setting: str, **kwargs: object) -> None:
    global _configured
    if setting == "CHASQUI":
        _configured = None


setting_changed.connect(_settings_changed)
