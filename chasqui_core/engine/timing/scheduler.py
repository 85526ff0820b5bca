"""The scheduler: fires each schedule's jobs at their due times, from one leader.

Every worker process may run one; a lock (SET NX PX, renewed by its holder,
like the promoter's) makes one of them the leader, and only the leader fires.
It reads the time from Redis, so machines with drifting clocks agree.

Exactly one job per due time, however many processes run and whatever
crashes: the job id is derived from the schedule's name and the due time
(``Schedule.job_id``), and adds with a given id are idempotent for a day, so
a fire repeated by a leader that died before recording it, or by a second
leader after a lock expiry, adds nothing. The state (next due time, last
fire) moves on only after the jobs are added, by ``schedule_advance.lua``,
which checks the lock and the due time read.

Misfires, due times that passed while no leader ran, follow each schedule's
policy (``plan_fires`` in schedules.py). A changed timing in settings starts
the schedule afresh from the next due time; a schedule no longer in the
leader's settings is not fired (its state stays for the console until
cleared).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import SCHEDULER_LOCK, schedule_fires, schedule_state
from chasqui_core.engine.timing.leader import LeaderLock
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.timing.schedules import Schedule, plan_fires
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.ops.stats import add_clock_read, server_ms

logger = logging.getLogger("chasqui.scheduler")

FIRES_KEPT = 20
"""Recent fires kept per schedule, for the console."""

Fire = Callable[[Schedule, int, str], Awaitable[None]]
"""Adds the job of one fire: ``await fire(schedule, due_ms, job_id)``; repeated with the same id, adds nothing."""


@dataclass(frozen=True, slots=True)
class FireRecord:
    """One fire, as kept in the schedule's list of recent fires."""

    due: int
    """The due time fired (epoch ms), or the moment of a fire by hand."""
    at: int
    """When the job was added (server clock, epoch ms)."""
    job_id: str
    queue: str
    how: str
    """``on_time``, ``late`` (within grace), ``catch_up`` (a missed due time, by the misfire policy) or ``manual``."""
    by: str = ""
    """Who fired it by hand."""

    def to_json(self) -> str:
        return json.dumps({"due": self.due, "at": self.at, "job": self.job_id, "queue": self.queue, "how": self.how,
                           "by": self.by}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> FireRecord | None:
        try:
            d = json.loads(raw)
            return cls(int(d["due"]), int(d["at"]), str(d["job"]), str(d["queue"]), str(d["how"]), str(d.get("by", "")))
        except (ValueError, TypeError, KeyError):
            return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Scheduler:
    def __init__(self, client: Client, scripts: Scripts, schedules: Sequence[Schedule], fire: Fire, holder: str, *,
                 lock_ttl_ms: int = 5000, max_sleep: float = 1.0) -> None:
        self.client = client
        self.scripts = scripts
        self.schedules = list(schedules)
        self.fire = fire
        self.holder = holder
        self.lock = LeaderLock(client, scripts, SCHEDULER_LOCK, holder, lock_ttl_ms, logger=logger,
                               label=f"scheduler {holder}")
        self.max_sleep = max_sleep
        """Longest nap between looks: a pause, a resume or a lost lock is noticed within it."""
        self.fired_total = 0

    @property
    def is_leader(self) -> bool:
        return self.lock.held

    @is_leader.setter
    def is_leader(self, value: bool) -> None:
        self.lock.held = value  # schedule_advance.lua found the lock gone: stop leading at once

    async def _acquire_or_renew(self) -> None:
        await self.lock.acquire_or_renew()

    async def tick(self) -> float:
        """Fire whatever is due; return the seconds until the next due time (capped by ``max_sleep``)."""
        pipe = self.client.pipeline(transaction=False)
        add_clock_read(pipe, SCHEDULER_LOCK)  # the clock of the node the schedules live on
        for schedule in self.schedules:
            pipe.hgetall(schedule_state(schedule.name))
        replies = await pipe.execute()
        now = server_ms(replies[0])
        soonest = now + int(self.max_sleep * 1000)
        for schedule, raw in zip(self.schedules, replies[1:], strict=True):
            state = {_text(k): _text(v) for k, v in raw.items()}
            try:
                next_due = await self._visit(schedule, state, now)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one schedule's trouble (a task that will not enqueue) must not stop the others
                logger.warning("schedule %s: could not fire: %s: %s", schedule.name, type(exc).__name__, exc)
                continue
            if next_due is not None:
                soonest = min(soonest, next_due)
        return max(0.0, (soonest - now) / 1000)

    async def _visit(self, schedule: Schedule, state: dict[str, str], now: int) -> int | None:
        """Fire one schedule if it is due; return its next due time (None when it did not move on)."""
        if state.get("version") != schedule.version or not state.get("next", "").isdigit():
            next_due = schedule.next_after(now)
            await self._advance(schedule, "", next_due, [], 0)
            logger.info("schedule %s (%s): next fire at %s", schedule.name, schedule.describe, _when(next_due))
            return next_due
        expected = int(state["next"])
        if expected > now:
            return expected
        if state.get("paused"):
            _, following, _ = schedule.due_between(expected, now, 1)
            await self._advance(schedule, state["next"], following, [], 0)  # a paused schedule skips, uncounted
            return following
        fire, following, missed = plan_fires(schedule, expected, now)
        records = []
        for due in fire:
            job_id = schedule.job_id(due)
            await self.fire(schedule, due, job_id)
            how = "catch_up" if now - due > schedule.grace_ms else ("on_time" if now - due < 1000 else "late")
            records.append(FireRecord(due, now, job_id, schedule.queue, how))
        applied = await self._advance(schedule, state["next"], following, records, missed)
        if applied:
            self.fired_total += len(records)
            if missed:
                logger.warning("schedule %s: %d due time(s) passed while no scheduler ran; misfire policy %s fired %d",
                               schedule.name, missed + len(records), schedule.misfire, len(records))
        return following

    async def _advance(self, schedule: Schedule, expected: str, next_due: int, records: list[FireRecord],
                       missed: int) -> bool:
        reply = await self.scripts.schedule_advance(
            keys=[SCHEDULER_LOCK, schedule_state(schedule.name), schedule_fires(schedule.name)],
            args=[self.holder, expected, next_due, schedule.version, missed, FIRES_KEPT,
                  *(r.to_json() for r in records)])
        if reply == 0:
            self.is_leader = False
        return bool(reply == 1)

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: take or keep the lock, fire what is due, sleep until the next due time."""
        while not stop.is_set():
            sleep = min(self.max_sleep, self.lock.ttl_ms / 3000)
            try:
                await self._acquire_or_renew()
                if self.is_leader:
                    sleep = min(sleep, await self.tick())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("scheduler: %s: %s", type(exc).__name__, exc)
                sleep = 1.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.01, sleep))
        await self.release()

    async def release(self) -> None:
        await self.lock.release()


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What Redis holds of one schedule, for the console and the API."""

    next_due: int | None
    """The next due time the leader computed; None before a scheduler first saw the schedule."""
    version: str
    """The definition's version ``next_due`` was computed for (see ``Schedule.version``)."""
    paused: dict[str, Any] | None
    """``{"by": who, "at": epoch ms}`` while paused."""
    fired: int
    missed: int
    recent: list[FireRecord]
    """Newest first, at most FIRES_KEPT."""


def read_states(client: Client, names: Sequence[str]) -> list[ScheduleState]:
    """The state of each named schedule, in one pipelined read (a sync client)."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(schedule_state(name))
        pipe.lrange(schedule_fires(name), 0, FIRES_KEPT - 1)
    replies = pipe.execute()
    out = []
    for raw, fires in zip(replies[::2], replies[1::2], strict=True):
        state = {_text(k): _text(v) for k, v in raw.items()}
        paused = None
        if state.get("paused"):
            with contextlib.suppress(ValueError):
                paused = json.loads(state["paused"])
        recent = [r for r in (FireRecord.from_json(f) for f in fires) if r is not None]
        nxt = state.get("next", "")
        out.append(ScheduleState(int(nxt) if nxt.isdigit() else None, state.get("version", ""), paused,
                                 int(state.get("fired", 0) or 0), int(state.get("missed", 0) or 0), recent))
    return out


def set_paused(client: Client, name: str, by: str | None) -> bool:
    """Pause (``by`` who) or resume (None) a schedule; False when it already was so (a sync client)."""
    key = schedule_state(name)
    if by is None:
        return bool(client.hdel(key, "paused"))
    at = server_ms(client.time())
    return bool(client.hsetnx(key, "paused", json.dumps({"by": by, "at": at})))


def record_fire(client: Client, scripts: Scripts, name: str, record: FireRecord) -> None:
    """Add a fire made by hand to the schedule's recent fires (a sync client); the due times do not move."""
    scripts.schedule_advance(keys=[SCHEDULER_LOCK, schedule_state(name), schedule_fires(name)],
                             args=["", "", "", "", 0, FIRES_KEPT, record.to_json()])


def queue_fire(url: str | None, signing_key: bytes | str | None = None) -> Fire:
    """A Fire that adds each job with an engine Queue (signed with ``signing_key``): for workers without Django."""
    queues: dict[str, Queue] = {}

    async def fire(schedule: Schedule, due_ms: int, job_id: str) -> None:
        queue = queues.get(schedule.queue)
        if queue is None:
            queue = queues[schedule.queue] = Queue(schedule.queue, url=url, signing_key=signing_key)
        await queue.aadd(schedule.task, schedule.args, schedule.kwargs, job_id=job_id, attempts=schedule.attempts,
                         backoff=schedule.backoff, result_ttl=schedule.result_ttl)

    return fire


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))
