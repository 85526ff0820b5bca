"""The few statistics the suite reports: medians and latency percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (p in 0..100).

    Nearest rank never interpolates: p99.9 of 3,000 samples is the third
    largest sample, a latency that really happened.
    """
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
