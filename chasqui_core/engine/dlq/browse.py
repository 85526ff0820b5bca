"""Reading a queue's DLQ: pages, counts, lookups and error groups.

Without a filter, or with a time range only, a page is an id range and costs
one XREVRANGE whatever the DLQ's size. Filters on task, reason, error class
or group, counts, the whole DLQ's groups and lookups by job id read the DLQ's
index (``index.py``) once it is ready. What the index cannot answer (a text
filter alone, groups of a filtered set) and every read while the index is
being rebuilt scan in chunks of ``SCAN_CHUNK`` entries under a caller-given
``scan_limit``, so no read holds Redis or the caller's memory for long; a
page then says where to carry on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.store.connection import Client, decodes_responses
from chasqui_core.engine.jobs.errors import JobNotFound
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.dlq.entries import (
    MAX_PART,
    DeadJob,
    Row,
    StreamId,
    decode_entry,
    field_text,
    format_id,
    id_after,
    id_before,
    id_of,
    parse_id,
)
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.fingerprint import fingerprint, fingerprint_id
from chasqui_core.engine.dlq.index import DLQIndex, IndexState, has_dimensions
from chasqui_core.engine.dlq.shared import resolve

SCAN_CHUNK = 500
"""Entries read per round trip when scanning; bounds each call's work and memory."""


def check_positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of 1 or more, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Page:
    items: list[DeadJob]
    next_cursor: str | None
    """Pass back as ``cursor`` for the next (older) page; None when nothing older can match."""
    scanned: int
    """Entries read to fill this page (more than ``len(items)`` when filtering)."""


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    fingerprint: str
    error_class: str
    sample_message: str
    """The last error message of the newest entry in the group."""
    count: int
    first_seen_ms: int
    last_seen_ms: int
    sample_entry_id: str
    tasks: list[str]
    fingerprint_id: str = ""
    """The id the entries were written with (empty: computed from ``fingerprint``)."""

    @property
    def id(self) -> str:
        """The fingerprint's id: pass it as a filter's ``fingerprint`` to act on this group."""
        return self.fingerprint_id or fingerprint_id(self.fingerprint)


@dataclass(frozen=True, slots=True)
class Grouping:
    """The grouped view: the biggest groups, and what says whether they cover the whole DLQ."""

    groups: list[ErrorGroup]
    whole: bool
    """True when every entry matching the filter was grouped (from the index); False after a bounded scan."""
    total_groups: int
    other_entries: int
    """Entries of the groups not listed (``whole`` only): the listed counts plus this are the total."""
    indexing: IndexState | None = None
    """The index's state when it was not ready (a rebuild under way)."""

    @property
    def groups_not_listed(self) -> int:
        return self.total_groups - len(self.groups)


class DLQReader:
    """The read side of one queue's DLQ, on a sync redis-py client; ``DeadLetters`` adds replay and discard."""

    def __init__(self, client: Client, queue: str) -> None:
        if decodes_responses(client):
            raise ValueError(
                f"{type(self).__name__} needs a Redis client that returns bytes (decode_responses=False): "
                "job payloads are binary; use chasqui_core.engine.store.connection.connect()"
            )
        self.client = client
        self.queue = queue
        self.keys = QueueKeys.for_queue(queue)
        self.index = DLQIndex(client, queue)

    def index_state(self) -> IndexState:
        """The index's state, after moving a rebuild on for a moment if one is needed (see ``DLQIndex.advance``)."""
        return self.index.advance()

    def count(self) -> int:
        return int(self.client.xlen(self.keys.dlq))

    def page(
        self,
        *,
        cursor: str | None = None,
        limit: int = 50,
        filter: DLQFilter | None = None,
        scan_limit: int = 20_000,
    ) -> Page:
        """Newest first, ``limit`` entries older than ``cursor``.

        Without a filter (or with a time range only) this is one XREVRANGE,
        cheap at any DLQ size. Other filters read chunks until ``limit``
        entries match or ``scan_limit`` entries were read; ``next_cursor``
        then lets the caller carry on from where the scan stopped.
        """
        check_positive(limit, "limit")
        check_positive(scan_limit, "scan_limit")
        f = filter if filter is not None and not filter.is_empty() else None
        bounds = self._bounds(f, cursor)
        if bounds is None:
            return Page([], None, 0)
        lo, hi = bounds
        if f is None or f.time_only():
            rows = self.client.xrevrange(self.keys.dlq, format_id(hi), format_id(lo), count=limit + 1)
            more = len(rows) > limit
            page = [decode_entry(self.queue, eid, flds) for eid, flds in rows[:limit]]
            return Page(page, page[-1].entry_id if more else None, len(page))
        if has_dimensions(f) and self.index.advance().ready:
            check = None
            if f.error_text is not None:
                def check(row: Row) -> bool:
                    return self._match(f, *row) is not None
            walked = self.index.page(f, cursor=cursor, limit=limit, scan_limit=scan_limit, check=check)
            return Page([decode_entry(self.queue, *row) for row in walked.rows], walked.next_cursor, walked.scanned)
        items: list[DeadJob] = []
        scanned = 0
        while True:
            want = min(SCAN_CHUNK, scan_limit - scanned)
            rows = self.client.xrevrange(self.keys.dlq, format_id(hi), format_id(lo), count=want)
            for eid, flds in rows:
                dead = self._match(f, eid, flds)
                if len(items) == limit:
                    if dead is not None:  # one more match: the next page starts here
                        return Page(items, items[-1].entry_id, scanned)
                elif dead is not None:
                    items.append(dead)
                scanned += 1
            if len(rows) < want:
                return Page(items, None, scanned)
            last = id_of(rows[-1][0])
            nxt = id_before(last)
            if nxt is None or nxt < lo:
                return Page(items, None, scanned)
            if scanned >= scan_limit or len(items) == limit:
                return Page(items, format_id(last), scanned)
            hi = nxt

    def get(self, entry_id: str) -> DeadJob:
        eid = format_id(parse_id(entry_id))
        rows = self.client.xrange(self.keys.dlq, eid, eid, count=1)
        if not rows:
            raise JobNotFound(
                f"No dead-letter entry {eid} in queue {self.queue!r}: it was replayed or discarded, "
                f"or the id is wrong"
            )
        return self._whole(decode_entry(self.queue, *rows[0]))

    def _whole(self, dead: DeadJob) -> DeadJob:
        """The entry with the tracebacks it shares with its group put back (``shared.resolve``)."""
        resolve(self.client, self.keys.dlq, [dead])
        return dead

    def find_by_job_id(self, job_id: str, *, scan_limit: int = 100_000) -> DeadJob | None:
        """The job's entry: from the index when it has it, or the newest among the newest ``scan_limit`` entries."""
        check_positive(scan_limit, "scan_limit")
        ready = self.index.advance().ready
        entry_id = self.index.find_job(job_id)
        if entry_id is not None:
            rows = self.client.xrange(self.keys.dlq, entry_id, entry_id, count=1)
            if rows:
                return self._whole(decode_entry(self.queue, *rows[0]))
        if ready:
            return None
        wanted = job_id.encode()
        for eid, flds in self._scan_newest(None, scan_limit):
            stored = flds.get(b"job_id")
            if stored:
                if stored == wanted:
                    return self._whole(decode_entry(self.queue, eid, flds))
            else:
                dead = decode_entry(self.queue, eid, flds)
                if dead.job_id == job_id:
                    return self._whole(dead)
        return None

    def count_matching(self, filter: DLQFilter, *, chunk: int = 1000) -> int:
        check_positive(chunk, "chunk")
        f = filter if filter is not None and not filter.is_empty() else None
        if f is None:
            return self.count()
        bounds = self._bounds(f)
        if bounds is None:
            return 0
        if f.error_text is None and self.index.advance().ready:
            return self.index.count(f) if has_dimensions(f) else self.index.count_range(f.since_ms, f.until_ms)
        return self._count_in(f, *bounds, chunk)

    def groups(self, filter: DLQFilter | None = None, *, scan_limit: int = 100_000) -> list[ErrorGroup]:
        """Matching entries grouped by fingerprint, biggest first; see ``grouping``."""
        return self.grouping(filter, scan_limit=scan_limit).groups

    def grouping(self, filter: DLQFilter | None = None, *, scan_limit: int = 100_000,
                 limit: int = 200) -> Grouping:
        """Entries grouped by fingerprint, biggest first.

        Over the whole DLQ (or a time range of it) the index answers, with
        the ``limit`` biggest groups and the count of the rest, so the counts
        add up to the DLQ's length. Other filters, or an index being rebuilt,
        group the matching entries among the newest ``scan_limit``.
        """
        check_positive(scan_limit, "scan_limit")
        check_positive(limit, "limit")
        f = filter if filter is not None and not filter.is_empty() else None
        state = self.index.advance()
        if state.ready and (f is None or f.time_only()):
            found = self.index.groups(limit=limit, since_ms=f.since_ms if f else None,
                                      until_ms=f.until_ms if f else None)
            samples = self._sample_rows([g.sample_entry_id for g in found.groups])
            out = []
            for g in found.groups:
                row = samples.get(g.sample_entry_id)
                error_class = field_text(row, b"error_class") if row else g.text.partition(":")[0]
                message = field_text(row, b"error") if row else ""
                out.append(ErrorGroup(g.text, error_class, message, g.count, g.first_seen_ms, g.last_seen_ms,
                                      g.sample_entry_id, g.tasks, g.id))
            return Grouping(out, True, found.total_groups, found.other_entries)
        groups = self._scan_groups(f, scan_limit)
        return Grouping(groups, False, len(groups), 0, None if state.ready else state)

    def _sample_rows(self, ids: list[str]) -> dict[str, dict[bytes, bytes]]:
        pipe = self.client.pipeline(transaction=False)
        for eid in ids:
            pipe.xrange(self.keys.dlq, eid, eid, count=1)
        return {eid: found[0][1] for eid, found in zip(ids, pipe.execute(), strict=True) if found}

    def _scan_groups(self, f: DLQFilter | None, scan_limit: int) -> list[ErrorGroup]:
        acc: dict[str, list[Any]] = {}
        for eid, flds in self._scan_newest(f, scan_limit):
            decided = True if f is None else f.precheck(id_of(eid)[0], flds)
            if decided is False:
                continue
            task = field_text(flds, b"task")
            if decided is None or not task:
                dead = decode_entry(self.queue, eid, flds)
                if f is not None and not f.matches(dead):
                    continue
                task = dead.task
            error_class, message = field_text(flds, b"error_class"), field_text(flds, b"error")
            key = fingerprint(error_class, message)
            stored = field_text(flds, b"fp")
            if stored:
                key = f"{key}\0{stored}"  # one group per id written, as the index counts them
            dead_at = id_of(eid)[0]
            group = acc.get(key)
            if group is None:  # newest first: the first seen is the sample
                acc[key] = [error_class, message, 1, dead_at, dead_at, eid.decode(), {task}]
            else:
                group[2] += 1
                group[3] = min(group[3], dead_at)
                group[4] = max(group[4], dead_at)
                group[6].add(task)
        out = [ErrorGroup(key.partition("\0")[0], g[0], g[1], g[2], g[3], g[4], g[5], sorted(t for t in g[6] if t),
                          key.partition("\0")[2]) for key, g in acc.items()]
        out.sort(key=lambda g: (-g.count, -g.last_seen_ms))
        return out

    # --- scanning, shared with the sweeps of DeadLetters ------------------------------------

    def _bounds(self, f: DLQFilter | None, cursor: str | None = None) -> tuple[StreamId, StreamId] | None:
        """The inclusive id range a filter's time range (and a page cursor) allow; None when empty."""
        lo: StreamId = (0, 0)
        hi: StreamId | None = (MAX_PART, MAX_PART)
        if f is not None and f.since_ms is not None:
            lo = (f.since_ms, 0)
        if f is not None and f.until_ms is not None:
            hi = id_before((f.until_ms, 0))
        if cursor is not None:
            below = id_before(parse_id(cursor, "cursor"))
            hi = below if hi is None or below is None else min(hi, below)
        if hi is None or hi < lo:
            return None
        return lo, hi

    def _match(self, f: DLQFilter | None, eid: bytes, flds: dict[bytes, bytes]) -> DeadJob | None:
        decided = True if f is None else f.precheck(id_of(eid)[0], flds)
        if decided is False:
            return None
        dead = decode_entry(self.queue, eid, flds)
        return dead if decided or f.matches(dead) else None  # type: ignore[union-attr]

    def _select(self, f: DLQFilter | None, rows: list[Row]) -> list[tuple[Row, DeadJob | None]]:
        """The matching rows, with the decoded entry when deciding needed it."""
        if f is None:
            return [(row, None) for row in rows]
        out: list[tuple[Row, DeadJob | None]] = []
        for row in rows:
            decided = f.precheck(id_of(row[0])[0], row[1])
            if decided:
                out.append((row, None))
            elif decided is None:
                dead = decode_entry(self.queue, *row)
                if f.matches(dead):
                    out.append((row, dead))
        return out

    def _scan_newest(self, f: DLQFilter | None, scan_limit: int) -> Iterator[Row]:
        bounds = self._bounds(f)
        if bounds is None:
            return
        lo, hi = bounds
        scanned = 0
        while scanned < scan_limit:
            want = min(SCAN_CHUNK, scan_limit - scanned)
            rows = self.client.xrevrange(self.keys.dlq, format_id(hi), format_id(lo), count=want)
            yield from rows
            scanned += len(rows)
            nxt = id_before(id_of(rows[-1][0])) if rows else None
            if len(rows) < want or nxt is None or nxt < lo:
                return
            hi = nxt

    def _scan_oldest(self, lo: StreamId, hi: StreamId, chunk: int) -> Iterator[list[Row]]:
        while lo <= hi:
            rows = self.client.xrange(self.keys.dlq, format_id(lo), format_id(hi), count=chunk)
            if rows:
                yield rows
            nxt = id_after(id_of(rows[-1][0])) if rows else None
            if len(rows) < chunk or nxt is None:
                return
            lo = nxt

    def _edges(self) -> tuple[StreamId, StreamId] | None:
        """Ids of the oldest and newest entries; None when the DLQ is empty."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xrange(self.keys.dlq, "-", "+", count=1)
        pipe.xrevrange(self.keys.dlq, "+", "-", count=1)
        first, last = pipe.execute()
        if not first or not last:
            return None
        return id_of(first[0][0]), id_of(last[0][0])

    def _count_in(self, f: DLQFilter | None, lo: StreamId, hi: StreamId, chunk: int) -> int:
        if f is None or f.time_only():
            edges = self._edges()
            if edges is None:
                return 0
            if lo <= edges[0] and edges[1] <= hi:  # the range covers the whole DLQ
                return self.count()
            return sum(len(rows) for rows in self._scan_oldest(lo, hi, chunk))
        return sum(len(self._select(f, rows)) for rows in self._scan_oldest(lo, hi, chunk))
