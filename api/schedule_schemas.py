"""Response shapes of the API's schedules: each schedule with its state and its recent fires.

Split from api/schemas.py; the arguments a schedule fires with pass through ``mask`` first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema

from chasqui_core.masking import mask


class FireOut(Schema):
    due: datetime = Field(description="The due time fired (for a fire by hand, the moment it was made).")
    fired_at: datetime
    job_id: str
    queue: str
    how: Literal["on_time", "late", "catch_up", "manual"] = Field(
        description="on_time; late (within the schedule's grace); catch_up (a due time missed while no worker "
                    "ran, fired by the misfire policy); manual (run now).")
    by: str = Field("", description="Who ran it by hand.")
    outcome: Literal["SUCCESSFUL", "FAILED", "READY", "RUNNING", "UNKNOWN"] = Field(
        description="The job's outcome: READY while it waits (or waits for a retry); UNKNOWN when no record is "
                    "kept (not run yet while result storage is off, or expired).")

    @classmethod
    def from_info(cls, f) -> FireOut:
        return cls(due=f.due, fired_at=f.fired_at, job_id=f.job_id, queue=f.queue, how=f.how, by=f.by,
                   outcome=f.outcome)


class ScheduleOut(Schema):
    name: str
    task: str
    queue: str
    timing: str = Field(description="The timing in words: 'every 30 s' or 'cron 0 3 * * * (America/Lima)'.")
    cron: str | None
    every: float | None = Field(description="Seconds between fires, for an 'every' schedule.")
    timezone: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempts: int | None = Field(description="Runs each fire gets, its retries included (null: the task's).")
    backoff: dict[str, Any] | None
    misfire: Literal["skip", "run_once", "run_all"]
    paused: bool
    paused_by: str
    paused_at: datetime | None
    next_fire: datetime | None = Field(description="Null while paused; in the past when no worker is running.")
    fired: int = Field(description="Jobs fired by the scheduler so far.")
    missed: int = Field(description="Due times that passed with no job (no worker ran), by the misfire policy.")
    last_fire: FireOut | None
    recent: list[FireOut] = Field(description="The latest fires, newest first (at most 20).")

    @classmethod
    def from_info(cls, s) -> ScheduleOut:
        d = s.definition
        return cls(name=s.name, task=s.task, queue=s.queue, timing=s.timing, cron=d["cron"], every=d["every"],
                   timezone=d["timezone"], args=mask(d["args"]), kwargs=mask(d["kwargs"]), attempts=d["attempts"],
                   backoff=d["backoff"], misfire=d["misfire"], paused=s.paused, paused_by=s.paused_by,
                   paused_at=s.paused_at, next_fire=s.next_fire, fired=s.fired, missed=s.missed,
                   last_fire=FireOut.from_info(s.last_fire) if s.last_fire else None,
                   recent=[FireOut.from_info(f) for f in s.recent])


class ScheduleListOut(Schema):
    items: list[ScheduleOut]


class ScheduleSwitchOut(Schema):
    schedule: str
    paused: bool
    changed: bool = Field(description="False when the schedule already was in that state.")
