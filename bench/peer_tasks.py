"""Noop jobs for the peer queues. RQ finds job functions by dotted path, so they live in a module.

Like the engine's benchmark handlers, each records when the first run
started and how many ran, so the peers' windows are timed the same way.
"""

from __future__ import annotations

import time

first: float | None = None
runs = 0


def reset() -> None:
    global first, runs
    first, runs = None, 0


def _started() -> None:
    global first, runs
    if first is None:
        first = time.perf_counter()
    runs += 1


def rq_noop(i: int) -> None:
    _started()


async def arq_noop(ctx: dict, i: int) -> None:
    _started()
