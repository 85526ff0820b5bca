"""How many entries a filter matches, answered within a bounded read: exact when small, else "about".

An operator confirming a replay of everything that matches must see the
figure at once, not after a scan of the whole DLQ. Up to ``budget`` entries
are read; when the filter's range holds no more than that the count is
exact. Otherwise the range's time span is cut in ``samples`` slices, each
read from both ends; the share of matches in each slice, weighed by the
slice's size (known when its two ends meet, else sized from the densities
there), gives an estimate, marked so the console says "about". Once the DLQ's index is ready (dlq/index.py), a
filter without free text is counted from it instead: exact, in milliseconds, at any size.
"""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core.engine.dlq.browse import DLQReader, check_positive
from chasqui_core.engine.dlq.entries import format_id, id_before, id_of
from chasqui_core.engine.dlq.filter import DLQFilter


@dataclass(frozen=True, slots=True)
class Estimate:
    count: int
    exact: bool
    """False: ``count`` is extrapolated from samples ("about")."""


def estimate_matching(reader: DLQReader, filter: DLQFilter, *, budget: int = 10_000, samples: int = 20,
                      use_index: bool = True) -> Estimate:
    """How many entries ``filter`` matches; ``use_index=False`` forces the bounded read (as free text does)."""
    check_positive(budget, "budget")
    check_positive(samples, "samples")
    if filter.is_empty():
        return Estimate(reader.count(), True)
    if use_index and filter.error_text is None and reader.index.advance().ready:  # the index counts it, at once
        return Estimate(reader.count_matching(filter), True)
    bounds = reader._bounds(filter)
    edges = reader._edges()
    if bounds is None or edges is None:
        return Estimate(0, True)
    lo, hi = max(bounds[0], edges[0]), min(bounds[1], edges[1])
    if lo > hi:
        return Estimate(0, True)
    whole = lo <= edges[0] and edges[1] <= hi
    if whole and filter.time_only():
        return Estimate(reader.count(), True)
    seen = matched = 0
    for rows in reader._scan_oldest(lo, hi, min(budget, 1000)):
        seen += len(rows)
        matched += len(reader._select(filter, rows))
        if seen >= budget:
            break
    else:
        return Estimate(matched, True)
    # Too many to read now: ``samples`` slices of the range's time span, each read from both of its ends (a
    # window of entries forward from its start, another backward from its end). A slice whose two windows meet
    # was read whole; otherwise the densities at its two ends size the part between them (their geometric mean:
    # a burst at one end weighs in without being stretched over the whole slice).
    window = max(1, budget // (2 * samples))
    span = hi[0] - lo[0] + 1
    edges_ms = [lo[0] + span * k // samples for k in range(samples + 1)]
    pipe = reader.client.pipeline(transaction=False)
    for k in range(samples):
        first = (edges_ms[k], 0) if k else lo
        last = id_before((edges_ms[k + 1], 0))
        last = hi if last is None or last > hi else last
        pipe.xrange(reader.keys.dlq, format_id(first), format_id(last), count=window)
        pipe.xrevrange(reader.keys.dlq, format_id(last), format_id(first), count=window)
    replies = pipe.execute()
    sized = matches = 0.0
    for k in range(samples):
        front, back = replies[2 * k], replies[2 * k + 1]
        if not front:
            continue
        by_id = {row[0]: row for row in front}
        by_id.update((row[0], row) for row in back)
        rows = list(by_id.values())
        share = len(reader._select(filter, rows)) / len(rows)
        if len(front) < window or id_of(back[-1][0]) <= id_of(front[-1][0]):
            entries = float(len(rows))  # the two windows meet: the whole slice was read
        else:
            t0, t1 = id_of(front[0][0])[0], id_of(front[-1][0])[0]
            t2, t3 = id_of(back[-1][0])[0], id_of(back[0][0])[0]
            d_front = len(front) / max(1, t1 - t0 + 1)
            d_back = len(back) / max(1, t3 - t2 + 1)
            entries = len(rows) + max(0, t2 - t1 - 1) * (d_front * d_back) ** 0.5
        sized += entries
        matches += entries * share
    if not sized:
        return Estimate(0, True)
    if whole:  # the range is the whole DLQ: its length is known, the slices' sizes only weigh the shares
        matches *= reader.count() / sized
    return Estimate(round(matches), False)
