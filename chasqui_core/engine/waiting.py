"""Browse the jobs in a queue's stream, newest or oldest first, a page at a time.

The stream holds waiting jobs and the ones delivered to a worker and not
settled yet; a page marks the latter from the consumer group's pending list,
read for the page's id range only. Pages are id ranges with an exclusive
cursor (the last entry id shown), so each costs two commands whatever the
stream's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from .connection import Client
from .dlq.entries import parse_id
from .envelope import DecodeError, Job, decode
from .keys import GROUP, QueueKeys

MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class StreamJob:
    entry_id: str
    job: Job | None
    """None when the entry is not a job envelope this version can read."""
    delivered_to: str | None
    """The consumer holding the entry (running, or fetched and about to run); None while it waits."""

    @property
    def job_id(self) -> str:
        return self.job.id if self.job is not None else ""


@dataclass(frozen=True, slots=True)
class StreamPage:
    items: list[StreamJob]
    next_cursor: str | None
    """Pass back as ``cursor`` (with the same order) for the next page; None on the last one."""


def page(client: Client, queue: str, *, cursor: str | None = None, limit: int = 50,
         newest_first: bool = True) -> StreamPage:
    """Up to ``limit`` stream entries after ``cursor`` in the order asked for, with who holds each."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_PAGE}, got {limit!r}")
    keys = QueueKeys.for_queue(queue)
    if cursor is not None:
        try:
            ms, seq = parse_id(cursor, "cursor")
        except ValueError:
            raise ValueError(f"Cursor {cursor!r} is not a stream entry id from a previous page; "
                             "start again without a cursor") from None
        start = f"({ms}-{seq}"
    else:
        start = "+" if newest_first else "-"
    end = "-" if newest_first else "+"
    if newest_first:
        rows = client.xrevrange(keys.stream, start, end, count=limit + 1)
    else:
        rows = client.xrange(keys.stream, start, end, count=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    holders: dict[bytes, str] = {}
    if rows:
        ids = [row[0] for row in rows]
        low, high = min(ids, key=_sid), max(ids, key=_sid)
        try:
            pending: list[dict[str, Any]] = client.xpending_range(keys.stream, GROUP, min=low, max=high,
                                                                  count=len(rows))
        except ResponseError:  # no consumer group yet: nothing was delivered
            pending = []
        for p in pending:
            name = p["consumer"]
            holders[p["message_id"]] = name.decode() if isinstance(name, bytes) else str(name)
    items = []
    for eid, fields in rows:
        try:
            job: Job | None = decode(fields.get(b"j", b""))
        except DecodeError:
            job = None
        items.append(StreamJob(eid.decode(), job, holders.get(eid)))
    return StreamPage(items, items[-1].entry_id if more and items else None)


def _sid(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)
