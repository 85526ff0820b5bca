"""The entries a bulk replay or discard acts on: those a filter matches, oldest first, a chunk at a time.

A filter on a value the DLQ's index keeps (task, reason, error class, group)
takes its ids from the index once it is ready (``DLQIndex.oldest_first``):
only the matching entries are read, and only when the caller needs them (a
text filter needs their messages; a replay's script reads its entries on the
server, and a replay or discard on indexed values alone reads none here). Entries an earlier operation removed are
gone from the index too, so a second run on the same filter starts moving
at its first chunk. Any other filter (free text alone, a time range, none),
or an index being rebuilt, reads the DLQ's id range and checks each row, as
before the index.

Both sweeps (``DeadLetters.replay_matching`` in the caller's process,
``Operations`` in a worker) go through ``chunks``, and both start their
figures from ``matching_total``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from chasqui_core.engine.dlq.browse import DLQReader
from chasqui_core.engine.dlq.entries import MAX_PART, DeadJob, Row, StreamId, decode_entry, format_id, id_after, id_of
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.index import has_dimensions


@dataclass(frozen=True, slots=True)
class Chunk:
    """One step of a sweep."""

    ids: list[str]
    """The matching entries' ids, oldest first."""
    dead: list[DeadJob] | None
    """Those entries decoded, when the caller asked for them; None otherwise."""
    start: str
    """Where this step started: a sweep that stops inside the step carries on from here."""
    cursor: str | None
    """Where the next step starts (an id, inclusive); None when the sweep reached its end."""
    read: int
    """DLQ entries read to decide this step (index ids are not entries)."""


def indexed(reader: DLQReader, f: DLQFilter | None) -> bool:
    """Whether a sweep of ``f`` takes its ids from the index (moving a rebuild on for a moment if one is due)."""
    return f is not None and has_dimensions(f) and reader.index.advance().ready


def matching_total(reader: DLQReader, f: DLQFilter | None, lo: StreamId, hi: StreamId) -> int | None:
    """How many entries in [lo, hi] match, when it can be told without reading entries; None otherwise."""
    if lo > hi:
        return 0
    if f is None or f.time_only():
        edges = reader._edges()
        if edges is None or hi < edges[0] or lo > edges[1]:
            return 0
        if lo <= edges[0] and edges[1] <= hi:
            return reader.count()
        if not reader.index.advance().ready:
            return None
        return reader.index.count_range(lo[0], hi[0] + 1) - _outside(reader, lo, hi)
    if f.error_text is not None or not indexed(reader, f):
        return None
    return reader.index.count(replace(f, since_ms=lo[0], until_ms=hi[0] + 1)) - _outside(reader, lo, hi, f)


def _outside(reader: DLQReader, lo: StreamId, hi: StreamId, f: DLQFilter | None = None) -> int:
    """Matching entries of lo's and hi's milliseconds that fall outside [lo, hi] (counts go by millisecond,
    and a resumed sweep's cursor rarely starts at a millisecond's first entry): read, since they are few."""
    rows: list[Row] = []
    if lo[1] > 0:
        rows += reader.client.xrange(reader.keys.dlq, format_id((lo[0], 0)), format_id((lo[0], lo[1] - 1)))
    nxt = id_after(hi)
    if nxt is not None and nxt[0] == hi[0]:
        rows += reader.client.xrange(reader.keys.dlq, format_id(nxt), format_id((hi[0], MAX_PART)))
    return len(reader._select(f, rows)) if rows else 0


def chunks(
    reader: DLQReader, f: DLQFilter | None, lo: StreamId, hi: StreamId, size: int, *, decode: bool
) -> Iterator[Chunk]:
    """The entries in [lo, hi] that ``f`` matches, oldest first, ``size`` ids (or entries read) per step.

    ``decode``: hand back each matching entry decoded (a replay needs it).
    """
    if lo > hi:
        return
    if indexed(reader, f):
        assert f is not None
        yield from _from_index(reader, f, lo, hi, size, decode)
        return
    at = lo
    for rows in reader._scan_oldest(lo, hi, size):
        selected = reader._select(f, rows)
        nxt = id_after(id_of(rows[-1][0]))
        dead = None
        if decode:
            dead = [d if d is not None else decode_entry(reader.queue, *row) for row, d in selected]
        yield Chunk(
            [row[0].decode() for row, _ in selected],
            dead,
            format_id(at),
            format_id(nxt) if nxt is not None and nxt <= hi else None,
            len(rows),
        )
        if nxt is None:
            return
        at = nxt


def _from_index(
    reader: DLQReader, f: DLQFilter, lo: StreamId, hi: StreamId, size: int, decode: bool
) -> Iterator[Chunk]:
    at = lo
    text = f.error_text is not None
    for ids, last in reader.index.oldest_first(f, lo, hi, size):
        nxt = id_after(last)
        cursor = format_id(nxt) if nxt is not None and nxt <= hi else None
        dead: list[DeadJob] | None = None
        read = 0
        if ids and (decode or text):
            rows = _fetch(reader, ids)
            read = len(rows)
            dead = [decode_entry(reader.queue, *row) for row in rows]
            if text:
                dead = [d for d in dead if f.matches(d)]
            kept = [d.entry_id for d in dead]
        else:
            kept = [eid.decode() for eid in ids]
        yield Chunk(kept, dead if decode else None, format_id(at), cursor, read)
        if cursor is None:
            return
        at = nxt  # type: ignore[assignment]


def _fetch(reader: DLQReader, ids: list[bytes]) -> list[Row]:
    """The entries still there of ``ids``, in one ``dlq_fetch.lua`` call."""
    out: list[Row] = []
    for found in reader.index.scripts.dlq_fetch(keys=[reader.keys.dlq], args=ids):
        if found:
            eid, flat = found
            out.append((eid, dict(zip(flat[::2], flat[1::2], strict=True))))
    return out
