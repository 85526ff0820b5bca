"""Reading a queue's streams for one job: a search's running tally, and stream reads from both ends at once.

``lookup.find_job`` searches stream after stream (and the DLQ's, which is one too) for a job whose entry id
it cannot know; this module holds the reads it makes: chunks taken forwards and backwards at once within a
budget, the read around a time (a ULID's, or the due time of a job promoted from the delayed set), the wide
read that starts near a ULID's time, and the check that a row holds the job. What the search
read and where it stopped short is kept in its ``Search``, so the answer can say it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgpack

from chasqui_core.engine.jobs.envelope import DecodeError, Job, decode
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys

CHUNK = 1000
"""Entries read per round trip while scanning a stream."""

CLOCK_SKEW_MS = 60_000
"""How far a producer's clock may run ahead of the server's: the lower bound of a ULID job's entries."""

NEAR = 4_000
"""Entries read around a ULID's millisecond (or a promoted job's due time) before a stream is read more widely."""

NEAR_SKEW_MS = 2_000
"""The usual bound on a producer clock's lead: the wide scans read from here first, the rest of the margin last."""


@dataclass
class Search:
    client: Client
    job_id: str
    scan_limit: int
    zscan_limit: int
    created_ms: int | None
    scanned: int = 0
    complete: bool = True
    cut_short: bool = False
    notes: list[str] = field(default_factory=list)
    near: dict[str, int] = field(default_factory=dict)
    """Per stream key, the most entries one read around a time took from it (a narrow lookup's coverage)."""
    narrowed: bool = False
    """Set when the scans beyond the places the id leads to were left out (``lookup.find_job(wide=False)``) and
    had something to read."""

    def note(self, text: str) -> None:
        self.notes.append(text)


def packed_id(job_id: str) -> bytes:
    """The id as an envelope packs it: a payload without these bytes is not the job's."""
    packed: bytes = msgpack.packb(job_id)
    return packed


def match_stream(search: Search, rows: list[tuple[bytes, dict[bytes, bytes]]]) -> tuple[bytes, Job] | None:
    needle = packed_id(search.job_id)
    for eid, fields in rows:
        payload = fields.get(b"j", b"")
        if needle in payload:
            try:
                job = decode(payload)
            except DecodeError:
                continue
            if job.id == search.job_id:
                return eid, job
    return None


def two_ends(search: Search, key: str, fwd_from: str, rev_from: str, low: str, budget: int, *,
              converge: bool) -> Iterator[list[tuple[bytes, dict[bytes, bytes]]]]:
    """Chunks read forwards from ``fwd_from`` and backwards from ``rev_from`` (down to ``low``), one pipelined
    round trip per pair, until both ends run out or ``budget`` entries were read; ``converge``: the two reads
    head towards each other and stop where they meet. Sets ``search.cut_short`` when the budget stopped it."""
    fwd: str | None = fwd_from
    rev: str | None = rev_from
    fwd_seen: tuple[int, int] | None = None  # the newest id read forwards
    rev_seen: tuple[int, int] | None = None  # the oldest id read backwards
    read = 0
    search.cut_short = False
    while fwd is not None or rev is not None:
        if read >= budget:
            search.cut_short = True
            return
        count = max(1, min(CHUNK, (budget - read) // (2 if fwd is not None and rev is not None else 1)))
        pipe = search.client.pipeline(transaction=False)
        if fwd is not None:
            pipe.xrange(key, fwd, "+", count=count)
        if rev is not None:
            pipe.xrevrange(key, rev, low, count=count)
        replies = pipe.execute()
        forward = replies.pop(0) if fwd is not None else None
        backward = replies.pop(0) if rev is not None else None
        for rows, forwards in ((forward, True), (backward, False)):
            if rows is None:
                continue
            full = len(rows) == count
            if converge and rows:
                seen = rev_seen if forwards else fwd_seen
                if seen is not None:
                    rows = [r for r in rows if (_sid(r[0]) < seen if forwards else _sid(r[0]) > seen)]
                    full = False if len(rows) < count else full
            read += len(rows)
            search.scanned += len(rows)
            if rows:
                yield rows
            nxt = "(" + rows[-1][0].decode() if full and rows else None
            if forwards:
                fwd_seen = _sid(rows[-1][0]) if rows else fwd_seen
                fwd = nxt
            else:
                rev_seen = _sid(rows[-1][0]) if rows else rev_seen
                rev = nxt
        if converge and fwd_seen is not None and rev_seen is not None and fwd_seen >= rev_seen:
            return


def _sid(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)


def wide(search: Search, key: str) -> Iterator[list[tuple[bytes, dict[bytes, bytes]]]]:
    """Every entry of a stream the job may be in, within ``scan_limit``: for a ULID, first from a moment
    before its creation forwards and from the newest entry backwards, then the rest of the clock-skew margin."""
    if search.created_ms is None:
        yield from two_ends(search, key, "-", "+", "-", search.scan_limit, converge=True)
        return
    near, low = max(0, search.created_ms - NEAR_SKEW_MS), max(0, search.created_ms - CLOCK_SKEW_MS)
    start = search.scanned
    yield from two_ends(search, key, f"{near}-0", "+", f"{near}-0", search.scan_limit, converge=True)
    if not search.cut_short and near > low:
        budget = search.scan_limit - (search.scanned - start)
        yield from two_ends(search, key, f"{low}-0", f"({near}-0", f"{low}-0", budget, converge=True)


def stream_near(search: Search, k: QueueKeys, created: int, when: str = "the id's time") -> tuple[bytes, Job] | None:
    """The job's entry among the ``NEAR`` entries around a time: its stream entry's id is about then (server
    clock), and, for a ULID's time, no earlier than ``CLOCK_SKEW_MS`` before it."""
    low = max(0, created - CLOCK_SKEW_MS)
    budget = min(NEAR, search.scan_limit)
    before = search.scanned
    for rows in two_ends(search, k.stream, f"{created}-0", f"({created}-0", f"{low}-0", budget, converge=False):
        hit = match_stream(search, rows)
        if hit is not None:
            search.note(f"the stream of {stream_name(k)} around {when}: found")
            return hit
    search.near[k.stream] = max(search.near.get(k.stream, 0), search.scanned - before)
    search.note(f"the stream of {stream_name(k)}: {search.scanned - before:,} entries around {when}")
    return None


def stream_name(k: QueueKeys) -> str:
    """A queue's stream as the notes name it: the queue, or the queue and its priority band."""
    return f"{k.queue} ({k.band} priority)" if k.band else k.queue


def stream_wide(search: Search, k: QueueKeys) -> tuple[bytes, Job] | None:
    before = search.scanned
    for rows in wide(search, k.stream):
        hit = match_stream(search, rows)
        if hit is not None:
            search.note(f"the whole stream of {stream_name(k)}: found")
            return hit
    search.complete = search.complete and not search.cut_short
    search.note(f"the whole stream of {stream_name(k)}: {search.scanned - before:,} entries"
                + (f" (stopped at the limit of {search.scan_limit:,})" if search.cut_short else ""))
    return None
