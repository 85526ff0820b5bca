"""Crash recovery: a live worker keeps its jobs, a dead worker's jobs go back to the stream.

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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from .connection import Client
from .envelope import error_record
from .keys import GROUP, QueueKeys
from .scripts import Scripts
from .stats import add_clock_read

logger = logging.getLogger("chasqui.worker")

PANIC_AFTER_DEATHS = 2
"""A job that was running when this many workers died is a poison pill (reason ``panic``)."""

LOST_FIELD = b"lost"
"""The stream field reclaim.lua writes on a dead worker's running entries: one line per lost run."""

RECOVERED_FIELD = b"recovered"
"""The stream field reclaim.lua writes on every entry it puts back: how many dead workers it was taken from."""

LOST_CLASS = "WorkerLost"
"""The error class a lost run leaves in the job's error history."""

ORPHANS_PER_PASS = 500
"""At most this many of a worker's own unheld entries are taken back in per queue and lease pass."""


@dataclass(frozen=True, slots=True)
class LostRun:
    """One run of a job that ended with its worker: who ran it, from when, and when that was noticed."""

    worker: str
    started_at: int
    lost_at: int

    def record(self, attempt: int, replays: int) -> dict[str, Any]:
        """The line this run leaves in the job's error history (``replays`` as the DLQ reader's own records)."""
        record = error_record(attempt=attempt, exc_class=LOST_CLASS,
                              message=f"worker lost: {self.worker} stopped answering while it ran this job",
                              traceback="", worker=self.worker, started_at=self.started_at, finished_at=self.lost_at)
        record["replays"] = replays
        return record


def lost_runs(field: bytes | None) -> list[LostRun]:
    """Read an entry's ``lost`` field; lines that cannot be read still count as a lost run each."""
    if not field:
        return []
    runs = []
    for line in field.decode(errors="replace").split("\n"):
        worker, _, rest = line.partition("\t")
        started, _, lost_at = rest.partition("\t")
        runs.append(LostRun(worker or "unknown", int(started) if started.isdigit() else 0,
                            int(lost_at) if lost_at.isdigit() else 0))
    return runs


@dataclass(frozen=True, slots=True)
class LeasePass:
    lost: list[bytes]
    """Held entries this worker no longer owns: reclaimed while it held them (it was silent too long)."""
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
        """Run ``lease.lua`` on one queue: alive key, renewals, journal sweep, orphans."""
        orphan_idle_ms = max(2 * int(self.every * 1000), 1000)
        lost, orphans = await self.scripts.lease(
            keys=[keys.stream, keys.alive(self.consumer), keys.running(self.consumer)],
            args=[GROUP, self.consumer, self.visibility_timeout_ms, orphan_idle_ms, ORPHANS_PER_PASS, *held])
        for entry_id in lost:
            logger.warning("entry %s on %s was taken back from this worker while it held it (it did not renew its "
                           "alive key for %d ms: the event loop was blocked?)", entry_id.decode(), keys.queue,
                           self.visibility_timeout_ms)
        return LeasePass(list(lost), [(orphans[i], orphans[i + 1]) for i in range(0, len(orphans), 2)])


@dataclass(frozen=True, slots=True)
class Reclaimed:
    entry_id: bytes
    new_id: bytes
    charged: bool
    """True when the dead worker was running it: the new entry carries a lost run."""


async def reclaim_abandoned(scripts: Scripts, keys: QueueKeys, consumer: str, *, min_idle_ms: int,
                            limit: int = 500, rounds: int = 10) -> list[Reclaimed]:
    """Put the entries of dead workers back on the stream, bounded per call; returns what was moved."""
    start: bytes | str = "-"
    moved: list[Reclaimed] = []
    for _ in range(rounds):
        last, flat = await scripts.reclaim(
            keys=[keys.stream], args=[GROUP, consumer, min_idle_ms, limit, start, keys.prefix, keys.metrics,
                  keys.running_prefix])
        for i in range(0, len(flat), 3):
            moved.append(Reclaimed(flat[i], flat[i + 1], bool(int(flat[i + 2]))))
        if not last:
            break
        start = b"(" + last
    for r in moved:
        logger.warning("put back entry %s on %s (now %s) from a worker that stopped answering: %s", r.entry_id.decode(),
                       keys.queue, r.new_id.decode(), "it was running, the run is charged" if r.charged
                       else "it had not started, uncharged")
    return moved


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
        pipe.delete(keys.running(name), keys.alive(name))
    pipe.hdel(keys.workers, *gone, *stale_beats)
    await pipe.execute()
    return gone + stale_beats
