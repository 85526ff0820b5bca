"""Empty a queue of its waiting jobs: the entries of its stream no worker was handed yet.

``purge.lua`` deletes them a chunk at a time, each chunk atomic: it reads the
consumer group's last-delivered id in the same call, so an entry a reader
fetched meanwhile is never deleted, and it counts what it deleted as
``purged`` in the queue's counters. Entries already delivered (running, or
fetched and about to run) stay and are settled as usual; the delayed set and
the DLQ are not touched. The jobs' idempotency markers (``job_id=``) are left
to expire, so a purged job id cannot be added again before its marker's TTL.
"""

from __future__ import annotations

from collections.abc import Callable

from .connection import Client
from .keys import GROUP, QueueKeys
from .scripts import Scripts

CHUNK = 1000
"""Entries deleted per call: a call holds the server for about a millisecond."""


def waiting(client: Client, keys: QueueKeys) -> int:
    """How many entries a purge would delete now: the stream's entries not delivered to a worker.

    The group's lag when the server knows it, else the stream's length less
    its pending entries (after deletions the server may not know the lag).
    """
    pipe = client.pipeline(transaction=False)
    pipe.xlen(keys.stream)
    pipe.xinfo_groups(keys.stream)
    length, groups = pipe.execute(raise_on_error=False)
    if isinstance(length, Exception) or isinstance(groups, Exception):
        return 0  # no stream: nothing waits
    for group in groups:
        name = group.get("name")
        if (name.decode() if isinstance(name, bytes) else name) != GROUP:
            continue
        lag = group.get("lag")
        if lag is not None:
            return int(lag)
        return max(0, int(length) - int(group.get("pending") or 0))
    return int(length)


def newest_id(client: Client, keys: QueueKeys) -> str:
    """The id of the stream's newest entry ('0-0' when empty): a purge bound."""
    newest = client.xrevrange(keys.stream, "+", "-", count=1)
    if not newest:
        return "0-0"
    raw = newest[0][0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def purge_waiting(
    scripts: Scripts,
    keys: QueueKeys,
    *,
    upto: str = "+",
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete the waiting entries of the queue's stream up to entry id ``upto``, chunk by chunk.

    Returns how many were deleted. With ``upto`` the newest id when the purge
    began (``newest_id``), jobs added while it runs are kept, and the loop
    ends however fast producers add.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be 1 or more, got {chunk}")
    total = 0
    while True:
        deleted, more = scripts.purge(keys=[keys.stream, keys.metrics], args=[GROUP, chunk, upto])
        total += int(deleted)
        if progress is not None and deleted:
            progress(total)
        if not int(more):
            return total
