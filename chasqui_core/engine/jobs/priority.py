"""Priorities: which of the jobs a worker holds starts next.

Django's Task API gives a job a priority from -100 to 100 (default 0).
Chasqui maps it to one of three bands, each a stream of its own under the
queue's hash tag (keys.py): ``high`` (above 0), the default band (0, the
queue's own stream, exactly as a queue without priorities has it) and
``low`` (below 0). Within a band jobs start in the order they were added.
A queue's band streams exist only once a prioritised job was added to them
(``band_stream`` in ``lua/prelude.lua``); a worker reads every band a queue
has in one XREADGROUP (reader.py).

What a worker has read waits in its ``Inbox``: one line per band. Which job
starts next depends on the mode:

- ``strict`` (the default): the highest band with a job waiting. Under
  sustained high-priority load, lower bands wait for as long as it lasts.
- ``weighted``: the bands take turns, 6 high, 3 default, 1 low in every 10
  starts, a band with nothing waiting giving its turn to the next. Every band
  progresses at least at its share of the worker's rate; none can starve.

The sync lane's threads take from an ``Inbox`` too (sync_lane.py), so a sync
job of a higher band starts before lower ones already waiting there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from chasqui_core.engine.store.keys import BANDS, HIGH, LOW

if TYPE_CHECKING:
    from chasqui_core.engine.worker.delivery import Delivery

MIN_PRIORITY: Final = -100
MAX_PRIORITY: Final = 100
"""The range Django's Task API allows (``django.tasks.base``), kept here for the engine's own callers."""

DEFAULT_LABEL: Final = "default"
"""What ``band_label`` calls the default band."""

PRIORITY_META: Final = "priority"
"""The envelope's meta key holding a job's priority, when it is not 0 (``band_of`` in lua/prelude.lua reads it)."""

STRICT: Final = "strict"
WEIGHTED: Final = "weighted"
MODES: Final = (STRICT, WEIGHTED)

_TURNS: Final = (0, 1, 0, 0, 1, 0, 2, 0, 1, 0)
"""The weighted mode's order of turns (band ranks): 6 high, 3 default, 1 low in every ten starts, spread out so
that no band waits ten starts for its turn."""


def band_of(priority: int) -> str:
    """The band a priority falls in: "high" above 0, "low" below, "" (the default band) at 0."""
    return HIGH if priority > 0 else LOW if priority < 0 else ""


def band_label(band: str) -> str:
    """A band's name for people and for JSON: "high", "default" or "low" ("" is the default band in keys)."""
    return band or DEFAULT_LABEL


def job_priority(meta: Mapping[str, Any] | None) -> int:
    """A job's priority from its envelope's meta (0 when it has none, or one this version cannot read)."""
    value = (meta or {}).get(PRIORITY_META, 0)
    return value if type(value) is int else 0


def check_priority(priority: object) -> int:
    """A job's priority, or ValueError saying what a priority must be."""
    if type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} (higher runs first), "
                         f"got {priority!r}")
    return priority


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"priority mode must be 'strict' or 'weighted', got {mode!r}")
    return str(mode)


class Inbox:
    """Deliveries read and not yet started, one line per band, taken in the order the mode says.

    Safe for the sync lane's threads to take from while the loop adds:
    ``deque`` appends and pops are atomic, and a take that finds a line
    emptied under it tries the next, and raises IndexError when all are empty
    (a lane thread then goes to sleep).
    """

    __slots__ = ("lines", "_turns", "_turn")

    def __init__(self, mode: str = STRICT) -> None:
        self.lines: tuple[deque[Delivery], ...] = tuple(deque() for _ in BANDS)
        """One line per band, by rank (0 high, 1 default, 2 low)."""
        self._turns = _TURNS if check_mode(mode) == WEIGHTED else None
        self._turn = 0

    def __len__(self) -> int:
        high, default, low = self.lines
        return len(high) + len(default) + len(low)

    def __bool__(self) -> bool:
        high, default, low = self.lines
        return bool(default or high or low)

    def __contains__(self, d: object) -> bool:
        return any(d in line for line in self.lines)

    def __iter__(self) -> Iterator[Delivery]:
        """A snapshot, highest band first."""
        return iter([d for line in self.lines for d in list(line)])

    def append(self, d: Delivery) -> None:
        self.lines[d.keys.rank].append(d)

    def remove(self, d: Delivery) -> None:
        """Take out one delivery (a cancelled one); ValueError when it is not here."""
        self.lines[d.keys.rank].remove(d)

    def clear(self) -> None:
        for line in self.lines:
            line.clear()

    def popleft(self) -> Delivery:
        """The next delivery to start; IndexError when none waits."""
        high, default, low = self.lines
        if not high and not low:  # a queue without priorities: one line, as fast as a plain deque
            try:
                return default.popleft()
            except IndexError:  # empty, or a job of another band added meanwhile (a lane thread)
                pass
        turns = self._turns
        if turns is None:
            order: tuple[deque[Delivery], ...] = self.lines
        else:
            first = turns[self._turn]
            self._turn = (self._turn + 1) % len(turns)
            order = self.lines[first:] + self.lines[:first]
        for line in order:
            try:
                return line.popleft()
            except IndexError:  # empty, or emptied by another thread since
                continue
        raise IndexError("no delivery waits")
