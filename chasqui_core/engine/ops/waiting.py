"""Browse the jobs in a queue's streams, a page at a time: highest priority band first, each newest or oldest first.

A stream holds waiting jobs and the ones delivered to a worker and not
settled yet; a page marks the latter from the consumer group's pending list,
read for the page's id range only. A queue with priority bands (priority.py)
has a stream per band: a page lists the high band's jobs, then the default
band's, then the low band's (the order a worker in strict mode starts them
in), each band newest or oldest first as asked. Pages are id ranges with an
exclusive cursor: the last entry shown, its band's name before it
(``high:<id>``, ``low:<id>``; a bare id is the default band's, as before
queues had bands). Each page costs two round trips whatever the streams'
lengths: the entries (a range of each band from the cursor's on), then who
holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.dlq.entries import parse_id
from chasqui_core.engine.jobs.envelope import DecodeError, Job, decode
from chasqui_core.engine.store.keys import BANDS, GROUP, QueueKeys
from chasqui_core.engine.jobs.priority import band_label, job_priority

MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class StreamJob:
    entry_id: str
    job: Job | None
    """None when the entry is not a job envelope this version can read."""
    delivered_to: str | None
    """The consumer holding the entry (running, or fetched and about to run); None while it waits."""
    band: str = ""
    """The priority band whose stream holds the entry: "high", "" (the default band) or "low"."""

    @property
    def job_id(self) -> str:
        return self.job.id if self.job is not None else ""

    @property
    def priority(self) -> int:
        """The job's priority (0 by default; -100 to 100, higher first)."""
        return job_priority(self.job.meta) if self.job is not None else 0

    @property
    def band_label(self) -> str:
        return band_label(self.band)

    @property
    def cursor(self) -> str:
        """This entry as a page cursor: its id, after its band's name for a band other than the default."""
        return f"{self.band}:{self.entry_id}" if self.band else self.entry_id


@dataclass(frozen=True, slots=True)
class StreamPage:
    items: list[StreamJob]
    next_cursor: str | None
    """Pass back as ``cursor`` (with the same order) for the next page; None on the last one."""


def parse_cursor(cursor: str) -> tuple[str, str]:
    """(band, entry id) from a page cursor; ValueError saying how to go on when it is not one."""
    band, _, entry = cursor.rpartition(":")
    try:
        if band not in BANDS:
            raise ValueError(band)
        ms, seq = parse_id(entry, "cursor")
    except ValueError:
        raise ValueError(f"Cursor {cursor!r} is not a stream entry id from a previous page (an id, or 'high:' or "
                         "'low:' and one); start again without a cursor") from None
    return band, f"{ms}-{seq}"


def page(client: Client, queue: str, *, cursor: str | None = None, limit: int = 50,
         newest_first: bool = True) -> StreamPage:
    """Up to ``limit`` entries after ``cursor``, highest band first and each in the order asked for, with who
    holds each."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_PAGE}, got {limit!r}")
    keys = QueueKeys.for_queue(queue)
    band, after = parse_cursor(cursor) if cursor is not None else (BANDS[0], None)
    bands = BANDS[BANDS.index(band):]
    first, last = ("+", "-") if newest_first else ("-", "+")
    pipe = client.pipeline(transaction=False)
    for b in bands:  # a band without a stream reads as no entries
        start = f"({after}" if after is not None and b == band else first
        stream = keys.in_band(b).stream
        if newest_first:
            pipe.xrevrange(stream, start, last, count=limit + 1)
        else:
            pipe.xrange(stream, start, last, count=limit + 1)
    rows: list[tuple[str, Any, Any]] = []
    for b, found in zip(bands, pipe.execute(), strict=True):
        rows.extend((b, eid, fields) for eid, fields in found[:limit + 1 - len(rows)])
    more = len(rows) > limit
    rows = rows[:limit]
    holders = _holders(client, keys, rows)
    items = []
    for b, eid, fields in rows:
        try:
            job: Job | None = decode(fields.get(b"j", b""))
        except DecodeError:
            job = None
        items.append(StreamJob(eid.decode(), job, holders.get((b, eid)), b))
    return StreamPage(items, items[-1].cursor if more and items else None)


def _holders(client: Client, keys: QueueKeys, rows: list[tuple[str, Any, Any]]) -> dict[tuple[str, bytes], str]:
    """Who holds each of ``rows`` that was delivered: one XPENDING per band on the page, in one round trip."""
    ids: dict[str, list[bytes]] = {}
    for b, eid, _ in rows:
        ids.setdefault(b, []).append(eid)
    if not ids:
        return {}
    pipe = client.pipeline(transaction=False)
    for b, band_ids in ids.items():
        pipe.xpending_range(keys.in_band(b).stream, GROUP, min=min(band_ids, key=_sid), max=max(band_ids, key=_sid),
                            count=len(band_ids))
    holders: dict[tuple[str, bytes], str] = {}
    for b, pending in zip(ids, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(pending, Exception):  # no consumer group yet: nothing was delivered
            continue
        for p in pending:
            name = p["consumer"]
            holders[(b, p["message_id"])] = name.decode() if isinstance(name, bytes) else str(name)
    return holders


def _sid(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)
