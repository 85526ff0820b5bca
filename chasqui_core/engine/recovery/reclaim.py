"""Crash recovery: a live worker keeps its jobs, a silent worker's jobs go back to the stream.

A stream entry stays pending on the consumer that read it until it is
settled. While a worker lives it runs ``lease.lua`` on each queue every third
of the visibility timeout: the script refreshes the worker's *alive* key,
renews the lease of every entry it holds and finds entries of its own it no
longer holds (``Leases``). Any worker's reclaim pass (``reclaim_abandoned``,
``reclaim.lua``) takes the entries idle past the visibility timeout whose
owner's alive key is gone, and puts them back at the stream's tail: those the
owner was running (its start journal, journal.py, says so) with a ``lost``
line that the reader charges to the job as a run; the others exactly as they
were. Liveness is judged by the alive key, on the server's clock, and never by
idle time alone: a worker slowed down by CPU load keeps its leases.

A lapsed alive key says a worker stopped answering, not that it died: a
partition or a blocked event loop lapses it too, and that worker may finish
the run and try to settle it. So a lost run is charged as a *death* (toward
``panic``) only when the worker's death is on record (``record_death``:
written by whoever saw the process end: its supervisor, when the child
exits; the worker itself as it stops; a worker of the same host that finds
its process gone, deathwatch.py); otherwise it is *lost contact*: a run made, a
``LostContact`` line in the job's history, and no death. The job runs again
either way (at least once). Should the silent worker come back, its lease pass
learns which of its entries were taken back (reclaim.lua notes them) apart from
those it settled meanwhile, and its late outcomes are dropped by settle.lua,
which applies nothing to an entry no longer pending.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from chasqui_core.engine.recovery import ended_runs
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.jobs.envelope import error_record, now_ms
from chasqui_core.engine.store.keys import BANDS, GROUP, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.ops.stats import add_clock_read

logger = logging.getLogger("chasqui.worker")

LOST_FIELD = b"lost"
"""The stream field reclaim.lua writes on a dead worker's running entries: one line per lost run."""

RECOVERED_FIELD = b"recovered"
"""The stream field reclaim.lua writes on an entry it puts back: how many workers whose death is on record it was
taken back from, uncharged or charged a death (a worker that only lost contact does not count)."""

LOST_CLASS = "WorkerLost"
"""The error class a run lost with a worker known dead leaves in the job's error history."""

LOST_CONTACT_CLASS = "LostContact"
"""The error class a run of a worker that stopped answering (with no death on record) leaves in the history."""

DEATH_RECORD_TTL_MS = 24 * 3600 * 1000
"""How long a death record waits for the reclaim that reads it (one visibility timeout later while any worker of
the queue runs): a day, and a crash loop leaves no more than a day of them. Left to lapse rather than deleted
with the worker: it names the queue, not a band, and a worker forgotten on one band may still have entries to
reclaim on another. A reclaim after it lapsed charges lost contact, never more."""

TAKEN_TTL_MS = 24 * 3600 * 1000
"""How long the ids taken back from a silent worker wait for its next lease pass (a day of partition)."""

ORPHANS_PER_PASS = 500
"""At most this many of a worker's own unheld entries are taken back in per queue and lease pass."""


@dataclass(frozen=True, slots=True)
class LostRun:
    """One run of a job that ended with its worker's silence: who ran it, from when, when that was noticed,
    and whether the worker is known dead (else only contact with it was lost)."""

    worker: str
    started_at: int
    lost_at: int
    died: bool = True

    def record(self, attempt: int, replays: int) -> dict[str, Any]:
        """The line this run leaves in the job's error history (``replays`` as the DLQ reader's own records)."""
        if self.died:
            cls, message = LOST_CLASS, f"worker lost: {self.worker} died while it ran this job"
        else:
            cls, message = LOST_CONTACT_CLASS, (f"lost contact: {self.worker} stopped answering while it ran this "
                                                "job, and nothing says its process ended (it may have finished "
                                                "the run); not counted as a death")
        record = error_record(attempt=attempt, exc_class=cls, message=message, traceback="", worker=self.worker,
                              started_at=self.started_at, finished_at=self.lost_at)
        record["replays"] = replays
        return record


def lost_runs(field: bytes | None) -> list[LostRun]:
    """Read an entry's ``lost`` field (written by reclaim.lua, the one writer of its lines); lines that cannot
    be read still count as a lost run each, and a line without a verdict (an older writer's) as a death."""
    if not field:
        return []
    runs = []
    for line in field.decode(errors="replace").split("\n"):
        worker, _, rest = line.partition("\t")
        started, _, rest = rest.partition("\t")
        lost_at, _, verdict = rest.partition("\t")
        runs.append(LostRun(worker or "unknown", int(started) if started.isdigit() else 0,
                            int(lost_at) if lost_at.isdigit() else 0, verdict != "contact"))
    return runs


@dataclass(frozen=True, slots=True)
class LeasePass:
    lost: list[bytes]
    """Held entries another worker's reclaim took back while this one was silent too long: they are no longer
    this worker's to run or settle (its outcome for them is dropped), and it should let go of them. Entries it
    settled meanwhile are not among them."""
    orphans: list[tuple[bytes, list[bytes]]]
    """Entries pending on this worker that it does not hold, with their fields: to take in again."""


class Leases:
    """One worker's side of recovery: its alive key and the leases of what it holds, per queue."""

    def __init__(self, scripts: Scripts, consumer: str, visibility_timeout_ms: int) -> None:
        self.scripts = scripts
        self.consumer = consumer
        self.visibility_timeout_ms = visibility_timeout_ms
        self.every = max(0.05, visibility_timeout_ms / 3000)
        """Seconds between passes: three passes fit in a visibility timeout, so one late pass loses nothing."""

    async def keep(self, keys: QueueKeys, held: list[bytes]) -> LeasePass:
        """Run ``lease.lua`` on one queue: alive key, renewals, journal sweep, orphans, entries taken back (the
        caller lets go of those, and says so)."""
        orphan_idle_ms = max(2 * int(self.every * 1000), 1000)
        taken, orphans = await self.scripts.lease(
            keys=[keys.stream, keys.alive(self.consumer), keys.running(self.consumer), keys.taken(self.consumer)],
            args=[GROUP, self.consumer, self.visibility_timeout_ms, orphan_idle_ms, ORPHANS_PER_PASS, *held])
        return LeasePass(list(taken), [(orphans[i], orphans[i + 1]) for i in range(0, len(orphans), 2)])


@dataclass(frozen=True, slots=True)
class Reclaimed:
    entry_id: bytes
    new_id: bytes
    charged: bool
    """True when the silent worker was running it: the new entry carries a lost run."""
    died: bool = False
    """True when that run is charged as a death (the worker's death is on record); False for lost contact."""


async def reclaim_abandoned(scripts: Scripts, keys: QueueKeys, consumer: str, *, min_idle_ms: int,
                            limit: int = 500, rounds: int = 10) -> list[Reclaimed]:
    """Put the entries of dead workers back on the stream, bounded per call; returns what was moved."""
    start: bytes | str = "-"
    moved: list[Reclaimed] = []
    for _ in range(rounds):
        last, flat = await scripts.reclaim(
            keys=[keys.stream], args=[GROUP, consumer, min_idle_ms, limit, start, keys.prefix, keys.metrics,
                  keys.running_prefix, keys.taken_prefix, TAKEN_TTL_MS, keys.dispatching_prefix, keys.ended_prefix])
        for i in range(0, len(flat), 3):
            how = int(flat[i + 2])
            moved.append(Reclaimed(flat[i], flat[i + 1], how != 0, how == 1))
        if not last:
            break
        start = b"(" + last
    for r in moved:
        logger.warning("put back entry %s on %s (now %s) from a worker that stopped answering: %s", r.entry_id.decode(),
                       keys.queue, r.new_id.decode(),
                       "its death is on record and it was running: the run is charged as a death" if r.died
                       else "it was running, with no death on record: the run is charged as lost contact"
                       if r.charged else "it had not started, uncharged")
    return moved


def add_death_record(pipe: Any, keys: QueueKeys, worker_id: str, how: str, at_ms: int, *,
                     first_only: bool = False) -> None:
    """Queue on ``pipe`` (sync or asyncio) the record that ``worker_id``'s process ended, on one queue.

    Only whoever saw the process end may write it: its supervisor when the
    child exits, the worker itself as it stops, or a worker beside it that
    sees its process gone (deathwatch.py). The reclaim then charges its runs
    as deaths (toward ``panic``); without it they are only lost contact.
    ``first_only``: keep a record already written (it says how the process ended).

    The runs the process ended, as it noted them on this host (ended_runs.py),
    lose their start marks first, in the same pipeline: a strike the network
    swallowed must not make a run that returned a death.
    """
    strike_ended_runs(pipe, keys, worker_id)
    pipe.set(keys.died(worker_id), f"{at_ms} {how}", px=DEATH_RECORD_TTL_MS, nx=first_only)


def strike_ended_runs(pipe: Any, keys: QueueKeys, worker_id: str) -> None:
    """Queue on ``pipe`` the strikes of the start marks on ``keys``'s queue of the runs ``worker_id``'s process
    noted as ended on this host (ended_runs.py): a strike the network swallowed, or one still unsent when the
    process stopped, must not make a run that returned a death."""
    ends = ended_runs.read(worker_id)
    if not ends:
        return
    for band in keys.band_keys(BANDS):  # this queue's journals (its bands'), on the record's server
        entry_ids = ends.get(band.running(worker_id))
        if entry_ids:
            pipe.hdel(band.running(worker_id), *entry_ids)
            # A mark the network delivers after this strike (sent before the end, held up by latency or a link
            # that came back) must not charge the run either: reclaim.lua skips the ids kept here.
            tombstones = band.ended(worker_id)
            pipe.sadd(tombstones, *entry_ids)
            pipe.pexpire(tombstones, DEATH_RECORD_TTL_MS)


def record_death(client: Client, queues: Iterable[str], *, host: str, pid: int, how: str,
                 supervisor_pid: int | None = None) -> list[str]:
    """Record that the worker process ``pid`` on ``host`` ended (a supervisor's call when a child exits).

    The process is found by its heartbeats in each queue's workers list (its
    worker id is its own); with ``supervisor_pid``, only one that named that
    supervisor. Two round trips on a sync client, whatever the number of
    queues. Returns the worker ids recorded dead (none when the process never
    beat, so held nothing).
    """
    all_keys = [QueueKeys.for_queue(q) for q in queues]
    pipe = client.pipeline(transaction=False)
    for keys in all_keys:
        pipe.hgetall(keys.workers)
    found: list[tuple[QueueKeys, str]] = []
    for keys, beats in zip(all_keys, pipe.execute(), strict=True):
        for name, raw in beats.items():
            try:
                info = msgpack.unpackb(raw, raw=False)
            except Exception:
                continue
            if (not isinstance(info, dict) or info.get("pid") != pid or info.get("host") != host
                    or (supervisor_pid is not None and info.get("supervisor") != supervisor_pid)):
                continue
            found.append((keys, name.decode(errors="replace") if isinstance(name, bytes) else name))
    if not found:
        return []
    pipe = client.pipeline(transaction=False)
    at = now_ms()
    for keys, worker_id in found:
        add_death_record(pipe, keys, worker_id, how, at)
    pipe.execute()
    return sorted({worker_id for _, worker_id in found})


async def forget_dead_workers(client: Client, keys: QueueKeys, own_id: str, *, grace_ms: int) -> list[str]:
    """Remove workers silent for longer than ``grace_ms`` from the consumer group and the workers list.

    Only consumers holding no pending entry are removed: a dead worker's
    entries are reclaimed first (after the visibility timeout), and deleting a
    consumer that still owns entries would drop them from the pending list,
    where nothing would ever find them again. Silence is judged by the
    worker's heartbeat on the server's clock; a consumer without a heartbeat
    (one that stopped cleanly) by its idle time. Returns the names removed.
    """
    pipe = client.pipeline(transaction=False)
    add_clock_read(pipe, keys.workers)
    pipe.hgetall(keys.workers)
    pipe.xinfo_consumers(keys.stream, GROUP)
    try:
        (seconds, micros), beats, consumers = await pipe.execute()
    except ResponseError as exc:
        if "NOGROUP" in str(exc) or "no such key" in str(exc):
            return []
        raise
    now = int(seconds) * 1000 + int(micros) // 1000
    last_seen: dict[str, int] = {}
    for name, raw in beats.items():
        name = name.decode(errors="replace") if isinstance(name, bytes) else name
        try:
            last_seen[name] = int(msgpack.unpackb(raw, raw=False)["last_seen"])
        except Exception:
            last_seen[name] = 0  # not a heartbeat we can read: as good as silent
    gone: list[str] = []
    consumer_names = set()
    for consumer in consumers:
        name = consumer["name"]
        name = name.decode(errors="replace") if isinstance(name, bytes) else name
        consumer_names.add(name)
        if name == own_id or int(consumer["pending"]):
            continue
        seen = last_seen.get(name)
        silent_for = now - seen if seen is not None else int(consumer["idle"])
        if silent_for > grace_ms:
            gone.append(name)
    stale_beats = [name for name, seen in last_seen.items()
                   if name != own_id and name not in consumer_names and now - seen > grace_ms]
    if not gone and not stale_beats:
        return []
    pipe = client.pipeline(transaction=False)
    for name in gone:
        pipe.xgroup_delconsumer(keys.stream, GROUP, name)
    for name in gone + stale_beats:
        pipe.delete(keys.running(name), keys.alive(name), keys.taken(name))
    pipe.hdel(keys.workers, *gone, *stale_beats)
    await pipe.execute()
    return gone + stale_beats
