"""Crash recovery: leases on running jobs, and reclaiming the jobs of dead workers.

A stream entry stays pending until it is settled. While its worker lives, the
worker renews the lease on every entry it holds (XCLAIM ... JUSTID, which
resets the idle time without counting a delivery), so a long job is never
taken over. Entries idle past the visibility timeout belong to a worker that
died: ``reclaim.lua`` claims them (XAUTOCLAIM) for a live worker, and routes
an entry already delivered too often to the DLQ as a poison pill.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .events import EVENTS_MAXLEN
from .keys import GROUP, QueueKeys

PANIC_AFTER_DEATHS = 2
"""A job in flight during this many worker deaths is a poison pill."""


@dataclass(frozen=True, slots=True)
class Reclaimed:
    entry_id: bytes
    fields: list[bytes]
    """The entry's fields as the server sends them: [name, value, ...]."""
    deliveries: int


async def extend_leases(scripts, keys: QueueKeys, consumer: str, entry_ids: Iterable[bytes]) -> list[bytes]:
    """Renew the lease of entries this consumer still owns; return the ones it lost."""
    ids = list(entry_ids)
    lost: list[bytes] = []
    for start in range(0, len(ids), 1000):
        lost += await scripts.lease(keys=[keys.stream], args=[GROUP, consumer, *ids[start:start + 1000]])
    return lost


async def reclaim(
    scripts,
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
