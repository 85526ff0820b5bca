"""Two loops measured taking turns, block by block, so that both see the same machine.

On a shared host, rates measured minutes apart differ by more than what a
layer of code costs; a row and its yardstick (``django-enqueue`` and
``Queue.add``, ``queue-add`` and a bare round trip) are measured in turns
and reported side by side, with the CPU each took in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .results import RATE, Measurement
from .stats import median


@dataclass(slots=True)
class Spent:
    """Wall-clock and this process's CPU seconds one side of ``in_blocks`` took over its ``jobs`` calls or jobs."""

    jobs: int
    wall: float = 0.0
    cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.jobs / self.wall

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.jobs * 1e6


def in_blocks(n: int, block: int, first: Callable[[int, int], None],
              second: Callable[[int, int], None]) -> tuple[Spent, Spent]:
    """Run ``first`` and ``second`` over ``range(n)`` in blocks, taking turns, and time each side.

    Each is called with a block's ``(start, stop)``; which goes first flips
    from block to block, so neither always meets the machine warmed (or
    disturbed) by the other.
    """
    spent = {first: Spent(n), second: Spent(n)}
    clock, cpu_clock = time.perf_counter, time.process_time
    for index, start in enumerate(range(0, n, block)):
        stop = min(n, start + block)
        for side in ((second, first) if index % 2 else (first, second)):
            t0, c0 = clock(), cpu_clock()
            side(start, stop)
            spent[side].wall += clock() - t0
            spent[side].cpu += cpu_clock() - c0
    return spent[first], spent[second]


def taking_turns(ctx, n: int, block: int, first: Callable[[int, int], None], second: Callable[[int, int], None],
                 check: Callable[[int], None]) -> tuple[list[Spent], list[Spent]]:
    """``ctx.repeat`` of ``in_blocks`` over ``n``, ``check(n)`` after each run: each side's runs."""
    def once(size: int) -> tuple[Spent, Spent]:
        spent = in_blocks(size, block, first, second)
        check(size)
        return spent

    runs = ctx.repeat(once, n)
    return [f for f, _ in runs], [s for _, s in runs]


def turns_row(scenario: str, label: str, runs: list[Spent], n: int, note: str, per: str) -> Measurement:
    """The row of one side of ``taking_turns``: its rates, and this process's CPU per ``per`` (median) in the note."""
    cpu = median([s.cpu_us for s in runs])
    return Measurement(scenario, label, RATE, [s.rate for s in runs], jobs=n, cpu_us_per_job=cpu,
                       note=f"{note}; this process used {cpu:.1f} µs of CPU per {per} (median)")
