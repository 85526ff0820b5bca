"""Schedules: repeatable jobs, and the due times they fire at.

A schedule is checked when it is read (from settings, at start), so a typo is
reported once, naming the schedule, and never in a worker at the first fire.
Due times are computed, not stored one by one: ``every`` schedules fire at
whole multiples of their period since the epoch and ``cron`` ones where the
expression matches in their time zone. Any process computes the same due
times, which is what lets a job id be derived from the schedule's name and the
due time, so that a fire repeated by a second leader adds nothing.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from chasqui_core.engine.jobs.backoff import coerce_backoff
from chasqui_core.engine.jobs.envelope import check_json_types
from chasqui_core.engine.store.keys import validate_queue_name

Misfire = Literal["skip", "run_once", "run_all"]
MISFIRE_POLICIES: tuple[Misfire, ...] = ("skip", "run_once", "run_all")

DEFAULT_GRACE_S = 60
"""How late a due time may still get its job (a leader failover, a worker restart across it); older is missed."""
DEFAULT_CATCH_UP = 100
"""At most this many jobs are added for one schedule at once, after an outage (the latest due times)."""
DEFAULT_RESULT_TTL = 7 * 24 * 3600
"""Seconds a fired job's outcome is kept, so the console can say how each recent fire went."""

_CRON_WALK_LIMIT = 10_000
"""Missed cron due times walked one by one before the walk jumps to the present."""
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}\Z")
_KEYS = frozenset({"task", "cron", "every", "timezone", "args", "kwargs", "queue", "attempts", "backoff", "misfire",
                   "grace", "catch_up", "result_ttl"})


class ScheduleError(ValueError):
    """A schedule's definition is wrong; the message names the schedule and the key."""


@dataclass(frozen=True, slots=True)
class Schedule:
    name: str
    task: str
    """The task's name as workers know it (for Django, its dotted module path)."""
    queue: str
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    attempts: int | None = None
    """Runs each fire gets, retries included: carried in the job, so every retry of the fire obeys it too."""
    backoff: dict[str, Any] | None = None
    """Backoff of each fire's retries (a BackoffSpec as a dict), carried in the job like ``attempts``."""
    misfire: Misfire = "skip"
    grace_ms: int = DEFAULT_GRACE_S * 1000
    catch_up: int = DEFAULT_CATCH_UP
    result_ttl: int = DEFAULT_RESULT_TTL

    @property
    def version(self) -> str:
        """A short digest of what decides the due times: when it changes, the next fire is recomputed."""
        what = f"{self.cron}|{self.every_ms}|{self.timezone}"
        return hashlib.sha1(what.encode()).hexdigest()[:12]

    @property
    def describe(self) -> str:
        """The timing in words, for lists: ``every 30 s`` or ``cron 0 3 * * * (America/Lima)``."""
        if self.every_ms is not None:
            seconds = self.every_ms / 1000
            return f"every {seconds:g} s"
        return f"cron {self.cron} ({self.timezone})"

    def job_id(self, due_ms: int) -> str:
        """The id of the job fired for ``due_ms``: the same in every process, so a repeated fire is a duplicate."""
        return f"schedule:{self.name}:{due_ms}"

    def next_after(self, after_ms: int) -> int:
        """The first due time strictly after ``after_ms`` (epoch milliseconds)."""
        if self.every_ms is not None:
            return (after_ms // self.every_ms + 1) * self.every_ms
        start = datetime.fromtimestamp(after_ms / 1000, ZoneInfo(self.timezone))
        nxt: datetime = croniter(self.cron, start).get_next(datetime)
        due = int(nxt.timestamp() * 1000)
        # croniter works in whole seconds; a start inside the matching second must not return that second
        return due if due > after_ms else self.next_after(after_ms + 1000 - after_ms % 1000)

    def due_between(self, first_ms: int, now_ms: int, limit: int) -> tuple[list[int], int, int]:
        """Due times from ``first_ms`` (a due time) up to ``now_ms``: the latest ``limit``, the next, the count.

        Returns ``(due, next_due, total)``: ``due`` in order, at most ``limit``
        long (the earliest are dropped), ``next_due`` the first due time after
        ``now_ms`` and ``total`` how many there were in all. A long outage is
        skipped over by arithmetic for ``every``, and for ``cron`` the walk
        stops early, so this never walks millions of due times.
        """
        if first_ms > now_ms:
            return [], first_ms, 0
        if self.every_ms is not None:
            last = now_ms // self.every_ms * self.every_ms
            total = (last - first_ms) // self.every_ms + 1
            due = [last - i * self.every_ms for i in range(min(limit, total) - 1, -1, -1)]
            return due, last + self.every_ms, total
        kept: list[int] = []
        total = 0
        at = first_ms
        while at <= now_ms:
            kept.append(at)
            total += 1
            if total == _CRON_WALK_LIMIT:  # stopped for months: jump to the latest due time (total is then a floor)
                latest = self.latest_at_or_before(now_ms)
                if latest > at:
                    kept.append(latest)
                    total += 1
                at = latest
            del kept[:-limit]
            at = self.next_after(at)
        return kept, at, total

    def latest_at_or_before(self, at_ms: int) -> int:
        """The last cron due time at or before ``at_ms``."""
        start = datetime.fromtimestamp((at_ms // 1000 + 1), ZoneInfo(self.timezone))
        prev: datetime = croniter(self.cron, start).get_prev(datetime)
        return int(prev.timestamp() * 1000)

    def to_dict(self) -> dict[str, Any]:
        """The definition as JSON types, for the API and the console."""
        return {
            "name": self.name, "task": self.task, "queue": self.queue, "cron": self.cron,
            "every": self.every_ms / 1000 if self.every_ms is not None else None, "timezone": self.timezone,
            "args": self.args, "kwargs": self.kwargs, "attempts": self.attempts, "backoff": self.backoff,
            "misfire": self.misfire, "grace": self.grace_ms / 1000, "catch_up": self.catch_up,
        }


def parse_schedule(name: str, raw: Mapping[str, Any], *, default_queue: str | None = None,
                   where: str = "SCHEDULES") -> Schedule:
    """Build a Schedule from a settings-style mapping, or raise ScheduleError naming what is wrong.

    ``default_queue`` is the task's own queue, used when the schedule names none.
    """
    label = f"{where}[{name!r}]"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ScheduleError(f"{where}: schedule name {name!r} is not valid: use 1 to 100 letters, digits, '_', "
                            "'-' or '.'")
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"{label} must be a dict with at least 'task' and one of 'cron' or 'every'")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ScheduleError(f"{label} has unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(_KEYS))}")
    task = raw.get("task")
    if not isinstance(task, str) or not task:
        raise ScheduleError(f"{label}['task'] must be the dotted path of a task, e.g. 'reports.tasks.nightly'")
    has_cron, has_every = raw.get("cron") is not None, raw.get("every") is not None
    if has_cron == has_every:
        raise ScheduleError(f"{label} needs exactly one of 'cron' (e.g. '0 3 * * *') or 'every' (seconds), "
                            f"{'not both' if has_cron else 'got neither'}")
    zone = raw.get("timezone", "UTC")
    try:
        if not isinstance(zone, str):
            raise ZoneInfoNotFoundError
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"{label}['timezone'] is {zone!r}, which is not a time zone name such as "
                            "'UTC' or 'America/Lima'") from None
    cron: str | None = None
    every_ms: int | None = None
    if has_cron:
        cron = raw["cron"]
        if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
            raise ScheduleError(f"{label}['cron'] is {cron!r}, which is not a 5-field cron expression "
                                "(minute hour day-of-month month day-of-week, e.g. '*/15 * * * *')")
    else:
        every = raw["every"]
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every >= 1:
            raise ScheduleError(f"{label}['every'] must be a number of seconds of 1 or more, got {every!r}")
        if "timezone" in raw:
            raise ScheduleError(f"{label}['timezone'] only applies to 'cron' schedules; 'every' counts seconds")
        every_ms = int(every * 1000)
    args = raw.get("args", [])
    kwargs = raw.get("kwargs", {})
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise ScheduleError(f"{label}['args'] must be a list")
    if not isinstance(kwargs, Mapping):
        raise ScheduleError(f"{label}['kwargs'] must be a dict")
    try:
        check_json_types(list(args), "args")
        check_json_types(dict(kwargs), "kwargs")
    except TypeError as exc:
        raise ScheduleError(f"{label}: {exc}") from None
    queue = raw.get("queue", default_queue)
    if queue is None:
        raise ScheduleError(f"{label} needs a 'queue' to put its jobs on")
    try:
        validate_queue_name(queue)
    except ValueError as exc:
        raise ScheduleError(f"{label}['queue']: {exc}") from None
    attempts = raw.get("attempts")
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1):
        raise ScheduleError(f"{label}['attempts'] must be a whole number of 1 or more, got {attempts!r}")
    backoff = None
    if raw.get("backoff") is not None:
        try:
            spec = coerce_backoff(raw["backoff"])
        except (TypeError, ValueError) as exc:
            raise ScheduleError(f"{label}['backoff'] is not valid: {exc}") from None
        backoff = spec.to_dict() if spec is not None else None
    misfire = raw.get("misfire", "skip")
    if misfire not in MISFIRE_POLICIES:
        raise ScheduleError(f"{label}['misfire'] must be one of {', '.join(MISFIRE_POLICIES)}, got {misfire!r}")
    grace = raw.get("grace", DEFAULT_GRACE_S)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise ScheduleError(f"{label}['grace'] must be a number of seconds, 0 or more, got {grace!r}")
    catch_up = raw.get("catch_up", DEFAULT_CATCH_UP)
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) or not 1 <= catch_up <= 10_000:
        raise ScheduleError(f"{label}['catch_up'] must be a whole number from 1 to 10000, got {catch_up!r}")
    result_ttl = raw.get("result_ttl", DEFAULT_RESULT_TTL)
    if isinstance(result_ttl, bool) or not isinstance(result_ttl, int) or not 0 <= result_ttl <= 366 * 24 * 3600:
        raise ScheduleError(f"{label}['result_ttl'] must be a whole number of seconds up to a year, "
                            f"got {result_ttl!r}")
    return Schedule(name=name, task=task, queue=queue, cron=cron, every_ms=every_ms, timezone=zone,
                    args=list(args), kwargs=dict(kwargs), attempts=attempts, backoff=backoff, misfire=misfire,
                    grace_ms=int(grace * 1000), catch_up=catch_up, result_ttl=result_ttl)


def plan_fires(schedule: Schedule, next_due: int, now_ms: int) -> tuple[list[int], int, int]:
    """Which due times to fire now: ``(fire, next_due, missed)``.

    Of the due times from ``next_due`` up to ``now_ms``, those at most
    ``grace`` old are late but on time: each gets its job, whatever the policy
    (a leader that takes over after a crash, or a worker restarted across a
    due time, catches up on them). Older ones were missed, and the misfire
    policy decides: ``skip`` fires none of them; ``run_once`` fires one job
    for all of them (the latest due time) unless an on-time one runs anyway;
    ``run_all`` fires each. Never more than ``catch_up`` jobs at once (the
    latest). ``missed`` counts due times that got no job.
    """
    due, following, total = schedule.due_between(next_due, now_ms, _CRON_WALK_LIMIT)
    if not due:
        return [], following, 0
    cut = bisect_left(due, now_ms - schedule.grace_ms)
    old, on_time = due[:cut], due[cut:]
    if schedule.misfire == "run_all":
        fire = old + on_time
    elif schedule.misfire == "run_once" and old and not on_time:
        fire = old[-1:]
    else:
        fire = on_time
    fire = fire[-schedule.catch_up:]
    return fire, following, total - len(fire)
