"""A worker's housekeeping: its lease passes, heartbeats, crash recovery of others, and its goodbye.

One loop beside the readers and the settler, each chore at its own pace: the
lease pass every third of the visibility timeout (recovery.Leases: the alive
key, renewals, orphans), the heartbeat every ``heartbeat_interval`` (with the
pause flags and the memory check), the reclaim of dead workers' entries, and
forgetting workers long gone. A chore that fails is logged and tried again
at its next turn.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

import msgpack

from chasqui_core.engine.ops import control, history
from chasqui_core.engine.worker.admission import Admission
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.limits import LimitGate, Limits
from chasqui_core.engine.worker.log_budget import LogBudget
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.recovery.deathwatch import SPACE_FIELD, DeathWatch, note_clean_stop
from chasqui_core.engine.recovery.reclaim import Leases, add_death_record, forget_dead_workers, reclaim_abandoned

logger = logging.getLogger("chasqui.worker")

CURRENT_JOBS_SHOWN = 20
"""How many running jobs a heartbeat lists (the oldest first): enough to spot a stuck one."""


def resident_kb() -> int:
    """This process's resident memory now, in KiB (0 where the system does not say)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0


class Stats(Protocol):
    processed: int
    failed: int
    started_at: float


class HousekeepingHost(Protocol):
    """What housekeeping reads of the worker it keeps (worker.Worker is one)."""

    id: str
    hostname: str
    keys: list[QueueKeys]
    streams: dict[str, list[QueueKeys]]
    paused: dict[str, bool]
    concurrency: int
    supervisor_pid: int | None
    problem: str
    client: Client
    scripts: Scripts
    settler: Settler
    outcomes: Outcomes
    admission: Admission
    journal: StartJournal
    held: InFlight
    limits: Limits
    gate: LimitGate
    visibility_timeout_ms: int
    heartbeat_interval: float
    dead_worker_grace_ms: int

    @property
    def stats(self) -> Stats: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def state(self) -> str: ...

    def all_streams(self) -> list[QueueKeys]: ...

    def learn_bands(self, keys: QueueKeys, bands: Collection[bytes | str]) -> bool: ...

    def check_memory(self) -> None: ...

    async def obey(self, command: str | None) -> bool: ...


Take = Callable[[QueueKeys, list[Any]], Awaitable[None]]
"""Takes in entries read from a stream (running.Runner.take): where orphans found by a lease pass go."""

LetGo = Callable[[QueueKeys, list[bytes]], None]
"""Lets go of held entries another worker took back (running.Runner.let_go)."""


class Housekeeping:
    def __init__(self, worker: HousekeepingHost, take: Take | None = None, let_go: LetGo | None = None) -> None:
        self.w = worker
        self.take = take
        """None before the worker runs jobs (its first heartbeat, at start)."""
        self.let_go = let_go
        self._failures = LogBudget(logger, "housekeeping failures", per_second=1)
        self.leases = Leases(worker.scripts, worker.id, worker.visibility_timeout_ms)
        self.deaths = DeathWatch(worker.client, worker.id)

    async def run(self) -> None:
        """Each chore at its own pace, and each on its own: one that keeps failing (a lease pass on a stream
        whose server is away, say) is tried again at the next turn without holding back the others."""
        w = self.w
        lease_every = self.leases.every
        reclaim_every = max(0.05, min(w.visibility_timeout_ms / 2000, 15.0))
        forget_every = max(0.5, min(w.dead_worker_grace_ms / 4000, 60.0))
        chores: list[tuple[str, float, Callable[[], Awaitable[None]]]] = [
            ("the lease pass", lease_every, self.keep_leases),
            ("the heartbeat", w.heartbeat_interval, self.heartbeat_and_memory),
            ("the reclaim of dead workers' entries", reclaim_every, self.reclaim),
            ("forgetting dead workers", forget_every, self.forget_dead_workers),
            ("reading operators' commands", control.CONTROL_INTERVAL, self.take_command),
            ("the history snapshot", history.SNAPSHOT_EVERY_S, self.snapshot),
        ]
        last = [0.0] * len(chores)
        while True:
            for i, (what, every, chore) in enumerate(chores):
                now = time.monotonic()
                if now - last[i] < every:
                    continue
                try:
                    await chore()
                    last[i] = now
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if self._failures.allow():
                        logger.warning("housekeeping: %s failed (%s: %s); trying again at its next turn", what,
                                       type(exc).__name__, exc)
            w.outcomes.summarise_logs()
            w.admission.summarise_logs()
            w.journal.summarise_logs()
            self._failures.summarise()
            await asyncio.sleep(min(lease_every, reclaim_every, w.heartbeat_interval, control.CONTROL_INTERVAL))

    async def heartbeat_and_memory(self) -> None:
        await self.heartbeat()
        self.w.check_memory()

    async def keep_leases(self) -> None:
        """Alive keys, renewals and orphans, stream by stream (see recovery.Leases), each stream on its own.

        Entries whose outcome waits in the settler are kept too: they are
        settled, not yet written, and must neither look abandoned nor be
        taken in again as orphans. Entries taken back by another worker while
        this one held them (it was silent past the visibility timeout) leave
        this worker's hands (``let_go``): they are another's now.
        """
        w = self.w
        if w.limits:
            await w.gate.renew(w.client, [d for d in w.held if d.slots], now_ms())
        failed: Exception | None = None
        for keys in w.all_streams():
            try:
                kept = await self.leases.keep(keys, [*w.held.by_stream(keys), *w.settler.unsettled(keys)])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # this stream's server may be away; the others' leases are kept still
                failed = exc
                continue
            if kept.lost and self.let_go is not None:
                self.let_go(keys, kept.lost)
            if kept.orphans:
                logger.warning("worker %s: %d entries on %s were pending on this worker but not held by it; taking "
                               "them in now", w.id, len(kept.orphans), keys.queue)
                if self.take is not None:
                    await self.take(keys, kept.orphans)
        if failed is not None:
            raise failed

    async def reclaim(self) -> None:
        """Put dead workers' entries back, queue by queue; a queue or stream that fails does not hold back the others.

        Just before a queue's streams are reclaimed, the deaths of this host's
        workers on it whose processes are gone go on record (recovery.deathwatch),
        so that their runs are charged as deaths even when nobody else saw them
        end (a child whose supervisor was killed). Looked at per queue, not once
        for the pass: a pass over many streams on a slow link takes seconds, and a
        worker that died after the look and lapsed before its stream's turn was
        charged lost contact (the soak met a poison pill that killed a third
        process that way, behind 200 ms of latency after a Redis restart).
        """
        w = self.w
        failed: Exception | None = None
        for queue_keys in w.keys:
            if w.paused[queue_keys.queue]:
                continue
            try:
                await self.deaths.look([queue_keys])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # their runs are lost contact then, if reclaimed before the next look
                failed = exc
            for keys in w.streams[queue_keys.queue]:
                try:
                    await reclaim_abandoned(w.scripts, keys, w.id, min_idle_ms=w.visibility_timeout_ms)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failed = exc
        if failed is not None:
            raise failed

    async def forget_dead_workers(self) -> None:
        w = self.w
        failed: Exception | None = None
        for keys in w.all_streams():
            try:
                names = await forget_dead_workers(w.client, keys, w.id, grace_ms=w.dead_worker_grace_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed = exc
                continue
            for name in names:
                logger.info("removed worker %s from %s: silent for over %d s and holding no jobs", name, keys.queue,
                            w.dead_worker_grace_ms // 1000)
        if failed is not None:
            raise failed

    async def snapshot(self) -> None:
        """Offer each queue's history snapshots (history.py): one small script call per queue."""
        w = self.w
        args = history.snapshot_args()
        for k in w.keys:
            await w.scripts.rollup(keys=[k.metrics], args=args)

    async def take_command(self) -> None:
        """Read the operator's command for this worker (control.py) and act on it; beat at once if it changed
        the worker's state, so the console shows it without waiting for the next heartbeat."""
        if await self.w.obey(await control.read(self.w.client, self.w.id)):
            await self.heartbeat()

    async def heartbeat(self) -> None:
        w = self.w
        info = msgpack.packb({
            "id": w.id, "host": w.hostname, "pid": os.getpid(), "queues": [k.queue for k in w.keys],
            "concurrency": w.concurrency, "in_flight": w.in_flight,
            "processed": w.stats.processed, "failed": w.stats.failed,
            "started_at": int(w.stats.started_at * 1000), "last_seen": now_ms(),
            "problem": w.problem, "rss_kb": resident_kb(), "current": self.current_jobs(),
            "supervisor": w.supervisor_pid, "state": w.state, SPACE_FIELD: self.deaths.space,
        })
        pipe = w.client.pipeline(transaction=False)
        for k in w.keys:
            pipe.hset(k.workers, w.id, info)
            pipe.exists(k.paused)
            pipe.smembers(k.bands)
        replies = await pipe.execute()
        for k, paused, bands in zip(w.keys, replies[1::3], replies[2::3], strict=False):
            if len(bands) != len(w.streams[k.queue]) - 1:  # a band's first job: lease and reclaim it too
                w.learn_bands(k, bands)
            if w.paused[k.queue] and not paused:
                logger.info("queue %s resumed", k.queue)
            elif paused and not w.paused[k.queue]:
                logger.info("queue %s is paused: not reading from it", k.queue)
            w.paused[k.queue] = bool(paused)

    def current_jobs(self) -> list[list[Any]]:
        """The longest-running jobs (task, job id, started at ms), at most CURRENT_JOBS_SHOWN of them."""
        return [[d.job.task, d.job.id, d.started] for d in self.w.held.running()[:CURRENT_JOBS_SHOWN]]

    async def announce_stop(self) -> None:
        """Put this process's end on record before its last runs finish: a run of it found lost from now on was
        lost with its exit (a crash while it winds down, or a supervisor gone, whose children stop by themselves
        and that can no longer record their deaths), so the reclaim charges it as a death, not lost contact.
        Written even with nothing running: a job fetched before the stop may still start (and crash) while the
        readers wind down. Runs that end as they should leave no mark to charge, so the record costs them
        nothing. Best effort: with Redis away, those runs count as lost contact, unless a worker of the same
        host sees the process gone (recovery.deathwatch).

        The alive key is set again first, in the same pipeline: a worker that was cut off past its visibility
        timeout has let it lapse, and a reclaim between the record and the next lease pass would take the runs it
        is still finishing and charge them as deaths (the soak met a run that succeeded 0.8 s after it was
        charged its second death, a ``panic``)."""
        w = self.w
        try:
            pipe = w.client.pipeline(transaction=False)
            for k in w.keys:
                pipe.set(k.alive(w.id), "1", px=w.visibility_timeout_ms)
                add_death_record(pipe, k, w.id, f"stopping with {w.in_flight} run(s) under way", now_ms())
            await asyncio.wait_for(pipe.execute(), timeout=2.0)
        except Exception:
            pass

    async def unregister(self) -> None:
        """Leave the workers list and drop the alive key; the start journal too, unless runs are still under way:
        then this process ends with them, and says so (a death record), so that another worker reclaims their
        entries charged with a death, not as lost contact (recovery.py). With Redis out of reach and every run
        ended, it leaves the note of a clean stop on the host instead, so that no worker beside it records its
        end as a death (recovery.deathwatch)."""
        w = self.w
        under_way = w.in_flight
        try:
            pipe = w.client.pipeline(transaction=False)
            for k in w.keys:
                pipe.hdel(k.workers, w.id)
                pipe.delete(k.alive(w.id))
                if not under_way:
                    bands = w.streams[k.queue]
                    pipe.delete(*[band.running(w.id) for band in bands], *[band.dispatching(w.id) for band in bands])
                else:
                    add_death_record(pipe, k, w.id, f"stopped with {under_way} run(s) under way", now_ms())
            pipe.delete(control.control_key(w.id))
            await pipe.execute()
        except Exception:
            if not under_way:
                note_clean_stop(w.id)
