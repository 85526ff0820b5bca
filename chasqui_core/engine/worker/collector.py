"""The cyclic garbage collector while a worker runs: a young generation sized for the worker's batches.

Python collects its young generation every 700 net allocations of tracked
objects (lists, dicts, class instances). A worker's allocations come in
batches that live together and die together: it reads up to 100 entries at
once and holds what it made of them until their jobs have run.
"""

from __future__ import annotations

import gc

YOUNG_GENERATION = 10_000
"""The cyclic collector's threshold for its young generation while a worker runs (Python's default is 700).

A batch of 100 entries read makes some 650 tracked objects (the reply's
lists, a delivery, its job and its reference per entry) that live until its
jobs have run. With 700, a batch and what was left of the one before came
near the threshold, so that a collection ran every other batch, walked the
batch while it was alive and moved it to the older generations, walked
again by theirs: a noop async job paid 1.5 µs of its 11 for it
(docs/benchmarks.md). With 10,000, a drain of 110,000 noop jobs ran 83
young collections, about one every thirteen batches, where it ran 596.
Nothing lives longer: the objects die with their batch as before; only a
cycle waits a little longer for its collection."""


def roomier_young_generation() -> int | None:
    """Raise the young generation's threshold to ``YOUNG_GENERATION`` unless it is higher already (or the
    collector is off); returns the threshold to put back, or None."""
    young, *older = gc.get_threshold()
    if 0 < young < YOUNG_GENERATION:
        gc.set_threshold(YOUNG_GENERATION, *older)
        return young
    return None


def restore_young_generation(young: int | None) -> None:
    """Put back the threshold found at the start, unless someone set another meanwhile."""
    current, *older = gc.get_threshold()
    if young is not None and current == YOUNG_GENERATION:
        gc.set_threshold(young, *older)

