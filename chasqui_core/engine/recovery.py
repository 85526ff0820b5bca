"""Crash recovery: leases on running jobs, and reclaiming the jobs of dead workers.

A stream entry stays pending until it is settled. While its worker lives, the
worker renews the lease on every entry it holds (XCLAIM ... JUSTID, which
resets the idle time without counting a delivery), so a long job is never
taken over. Entries idle past the visibility timeout belong to a worker that
died: ``reclaim.lua`` claims them (XAUTOCLAIM) for a live worker, and routes
an entry already delivered too often to the DLQ as a poison pill.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from .connection import Client
from .events import EVENTS_MAXLEN
from .keys import GROUP, QueueKeys
from .scripts import Scripts
from .stats import add_clock_read

logger = logging.getLogger("chasqui.worker")

PANIC_AFTER_DEATHS = 2
"""A job in flight during this many worker deaths is a poison pill."""


@dataclass(frozen=True, slots=True)
class Reclaimed:
    entry_id: bytes
    fields: list[bytes]
    """The entry's fields as the server sends them: [name, value, ...]."""
    deliveries: int


async def extend_leases(scripts: Scripts, keys: QueueKeys, consumer: str, entry_ids: Iterable[bytes]) -> list[bytes]:
    """Renew the lease of entries this consumer still owns; return the ones it lost."""
    ids = list(entry_ids)
    lost: list[bytes] = []
    for start in range(0, len(ids), 1000):
        lost += await scripts.lease(keys=[keys.stream], args=[GROUP, consumer, *ids[start:start + 1000]])
    return lost


class Leases:
    """The entries one worker holds, and when it last renewed each one's lease.

    A held entry is renewed once a third of the visibility timeout has passed,
    so a live worker's jobs never look abandoned however long they run.
    """

    def __init__(self, scripts: Scripts, consumer: str, visibility_timeout_ms: int) -> None:
        self.scripts = scripts
        self.consumer = consumer
        self.horizon = visibility_timeout_ms / 3000
        self.held: dict[bytes, tuple[QueueKeys, float]] = {}
        """Entry id -> (its queue's keys, when its lease was last renewed, monotonic seconds).

        The worker adds and removes entries here directly, once per job: a
        method call each way would cost the hot path more than the dict does.
        """

    async def renew(self, now: float) -> None:
        """Renew every lease older than the horizon; log the entries another worker took meanwhile."""
        stale: dict[str, list[bytes]] = {}
        keys_by_queue: dict[str, QueueKeys] = {}
        for entry_id, (keys, since) in list(self.held.items()):
            if now - since >= self.horizon:
                stale.setdefault(keys.queue, []).append(entry_id)
                keys_by_queue[keys.queue] = keys
                self.held[entry_id] = (keys, now)
        for queue, ids in stale.items():
            for entry_id in await extend_leases(self.scripts, keys_by_queue[queue], self.consumer, ids):
                logger.warning("entry %s on %s was reclaimed by another worker while this one held it "
                               "(the event loop was blocked past the visibility timeout?)", entry_id.decode(), queue)


async def reclaim_abandoned(scripts: Scripts, keys: QueueKeys, consumer: str, *, min_idle_ms: int,
                            room: Callable[[], int], accept: Callable[[QueueKeys, list[Any], int], Awaitable[None]],
                            rounds: int = 10) -> None:
    """Take over entries idle past the visibility timeout, as much as ``room()`` allows, bounded per call."""
    cursor: bytes | str = b"0-0"
    for _ in range(rounds):
        free = room()
        if free <= 0:
            return
        cursor, entries = await reclaim(scripts, keys, consumer, min_idle_ms=min_idle_ms, limit=min(free, 500),
                                        cursor=cursor)
        for e in entries:
            logger.warning("reclaimed job entry %s on %s from a worker that stopped answering (delivery %d)",
                           e.entry_id.decode(), keys.queue, e.deliveries)
            await accept(keys, [(e.entry_id, e.fields)], e.deliveries)
        if cursor in (b"0-0", "0-0"):
            return


async def reclaim(
    scripts: Scripts,
    keys: QueueKeys,
    consumer: str,
    *,
    min_idle_ms: int,
    limit: int,
    cursor: bytes | str = b"0-0",
) -> tuple[bytes, list[Reclaimed]]:
    """Claim up to ``limit`` abandoned entries; returns (next cursor, entries)."""
    next_cursor, flat = await scripts.reclaim(
        keys=[keys.stream, keys.dlq, keys.events],
        args=[GROUP, consumer, min_idle_ms, limit, cursor, PANIC_AFTER_DEATHS,
              keys.metrics, EVENTS_MAXLEN],
    )
    out = []
    for i in range(0, len(flat), 3):
        out.append(Reclaimed(flat[i], flat[i + 1], int(flat[i + 2])))
    return next_cursor, out


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
    if gone or stale_beats:
        pipe.hdel(keys.workers, *gone, *stale_beats)
    await pipe.execute()
    return gone + stale_beats
