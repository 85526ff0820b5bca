"""Schedules: each one's timing, next and last fires and how they went; pause, resume, run now.

The schedules themselves come from settings (chasqui_core/schedules.py), so
every web process knows them; their state (next due time, recent fires,
pause) is in Redis, written by the scheduler's leader and by the operations
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from chasqui_core import access
from chasqui_core import schedules as configured_schedules
from chasqui_core.engine.timing import scheduler
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.jobs.results import decode_result
from chasqui_core.engine.timing.schedules import Schedule
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.ops.stats import server_ms
from chasqui_core.models import AuditEntry
from chasqui_core.services.audit import record
from chasqui_core.services.common import InvalidInput, NotFound, Source, check_source, redis_client, require
from chasqui_core.task_results import ms_to_datetime

OUTCOMES = ("SUCCESSFUL", "FAILED", "READY", "RUNNING")


@dataclass(frozen=True, slots=True)
class FireInfo:
    due: datetime
    fired_at: datetime
    job_id: str
    queue: str
    how: str
    """on_time, late, catch_up (a missed due time fired by the misfire policy) or manual."""
    by: str
    outcome: str
    """SUCCESSFUL, FAILED, READY (waiting, or waiting for a retry), RUNNING, or UNKNOWN (no record: not run
    yet while result storage is off, or expired)."""


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    name: str
    task: str
    queue: str
    timing: str
    """The timing in words: ``every 30 s`` or ``cron 0 3 * * * (America/Lima)``."""
    definition: dict[str, Any]
    next_fire: datetime | None
    """None while paused."""
    paused: bool
    paused_by: str
    paused_at: datetime | None
    fired: int
    missed: int
    """Due times that passed with no job (no scheduler running), by the misfire policy."""
    last_fire: FireInfo | None
    recent: list[FireInfo]


def _configured() -> dict[str, Schedule]:
    try:
        return configured_schedules.configured()
    except ImproperlyConfigured as exc:
        raise InvalidInput(f"The schedules in settings are not valid: {exc}") from None


def _schedule(name: Any) -> Schedule:
    found = _configured().get(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join(sorted(_configured())) or "none"
        raise NotFound(f"No schedule named {name!r}; schedules in settings.CHASQUI['SCHEDULES']: {known}")
    return found


def schedule_list(actor, *, source: Source = "api") -> list[ScheduleInfo]:
    """Every schedule of the settings with its state: two pipelined reads for all of them."""
    require(actor, access.VIEW, source)
    return _infos(list(_configured().values()))


def schedule_detail(actor, name: str, *, source: Source = "api") -> ScheduleInfo:
    require(actor, access.VIEW, source)
    return _infos([_schedule(name)])[0]


def _infos(schedules: list[Schedule]) -> list[ScheduleInfo]:
    client = redis_client()
    states = scheduler.read_states(client, [s.name for s in schedules])
    pipe = client.pipeline(transaction=False)
    for state in states:
        for fire in state.recent:
            pipe.get(QueueKeys.for_queue(fire.queue).result + fire.job_id)
    blobs = iter(pipe.execute())
    now = now_ms()
    out = []
    for schedule, state in zip(schedules, states, strict=True):
        recent = [_fire_info(fire, next(blobs)) for fire in state.recent]
        paused = state.paused or {}
        if state.paused:
            next_due = None
        elif state.next_due is None or state.version != schedule.version:
            next_due = schedule.next_after(now)  # what the scheduler will compute when it first sees it
        else:
            next_due = state.next_due  # in the past while no scheduler runs: the console shows it as overdue
        out.append(ScheduleInfo(
            name=schedule.name, task=schedule.task, queue=schedule.queue, timing=schedule.describe,
            definition=schedule.to_dict(), next_fire=ms_to_datetime(next_due) if next_due is not None else None,
            paused=bool(state.paused), paused_by=str(paused.get("by", "")),
            paused_at=ms_to_datetime(paused["at"]) if isinstance(paused.get("at"), int) else None,
            fired=state.fired, missed=state.missed, last_fire=recent[0] if recent else None, recent=recent))
    return out


def _fire_info(fire: scheduler.FireRecord, blob: bytes | None) -> FireInfo:
    outcome = "UNKNOWN"
    if blob:
        try:
            status = decode_result(blob).get("status")
        except Exception:  # a damaged record says nothing, it does not break the page
            status = None
        if status in OUTCOMES:
            outcome = status
    return FireInfo(due=ms_to_datetime(fire.due), fired_at=ms_to_datetime(fire.at), job_id=fire.job_id,
                    queue=fire.queue, how=fire.how, by=fire.by, outcome=outcome)


def pause(actor, name: str, *, source: Source) -> bool:
    """Stop firing the schedule (due times pass without a job until it is resumed); False when already paused."""
    return _switch(actor, name, source, paused=True)


def resume(actor, name: str, *, source: Source) -> bool:
    """Fire the schedule again from its next due time; False when it was not paused."""
    return _switch(actor, name, source, paused=False)


def _switch(actor, name: str, source: Source, *, paused: bool) -> bool:
    check_source(source)
    require(actor, access.PAUSE, source)
    schedule = _schedule(name)
    who = getattr(actor, "username", "") or source
    changed = scheduler.set_paused(redis_client(), schedule.name, who if paused else None)
    action = AuditEntry.Action.SCHEDULE_PAUSE if paused else AuditEntry.Action.SCHEDULE_RESUME
    record(actor, action, source=source, queue=schedule.queue, count=1 if changed else 0,
           detail={"schedule": schedule.name, "changed": changed})
    return changed


def run_now(actor, name: str, *, source: Source) -> FireInfo:
    """Add one job of the schedule now, outside its timing (its due times do not move; a paused one runs too)."""
    check_source(source)
    require(actor, access.ENQUEUE, source)
    schedule = _schedule(name)
    client = redis_client()
    at = server_ms(client.time())
    job_id = f"schedule:{schedule.name}:manual:{at}"
    configured_schedules.fire(schedule, job_id)
    who = getattr(actor, "username", "") or source
    fire = scheduler.FireRecord(at, at, job_id, schedule.queue, "manual", who)
    scheduler.record_fire(client, Scripts(client), schedule.name, fire)
    record(actor, AuditEntry.Action.SCHEDULE_RUN, source=source, queue=schedule.queue, target_ids=[job_id], count=1,
           detail={"schedule": schedule.name})
    return _fire_info(fire, None)
