"""How many entries a filter matches, answered within a bounded read: exact when small, else "about".

An operator confirming a replay of everything that matches must see the
figure at once, not after a scan of the whole DLQ. Up to ``budget`` entries
are read; when the filter's range holds no more than that the count is
exact. Otherwise the share of matches in ``samples`` windows spread over the
range's time span, times the range's size, gives an estimate, marked so the
console says "about". When the DLQ's readers count a filter from an index,
``DLQReader.count_matching`` is exact and quick and takes this one's place.
"""

from __future__ import annotations

from dataclasses import dataclass

from .browse import DLQReader, check_positive
from .entries import format_id
from .filter import DLQFilter


@dataclass(frozen=True, slots=True)
class Estimate:
    count: int
    exact: bool
    """False: ``count`` is extrapolated from samples ("about")."""


def estimate_matching(reader: DLQReader, filter: DLQFilter, *, budget: int = 10_000, samples: int = 10) -> Estimate:
    check_positive(budget, "budget")
    check_positive(samples, "samples")
    if filter.is_empty():
        return Estimate(reader.count(), True)
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
    # too many to read now: the share of matches in windows spread over the range's time span
    window = max(1, budget // samples)
    span = hi[0] - lo[0]
    seen = matched = 0
    pipe = reader.client.pipeline(transaction=False)
    for k in range(samples):
        start = (lo[0] + span * k // samples, 0) if k else lo
        pipe.xrange(reader.keys.dlq, format_id(max(start, lo)), format_id(hi), count=window)
    for rows in pipe.execute():
        seen += len(rows)
        matched += len(reader._select(filter, rows))
    if not seen:
        return Estimate(0, True)
    size = reader.count()
    if not whole:
        full_span = max(1, edges[1][0] - edges[0][0])
        size = size * max(1, span) // full_span
    return Estimate(round(size * matched / seen), False)
