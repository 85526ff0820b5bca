"""The soak's rules for one job's runs: which were lost with their process, which outcomes the evidence says
were lost, when a run stopped being under way, and which overlapped.

Pure functions of the ledger's runs, the job's kind and the deaths the watcher saw, which ``verdict.judge``
applies to every job; the reasons behind each rule are in verdict.py's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .kinds import HANG_TIMEOUT, Kind
from .ledger import Run

WATCH_SLACK = 0.5
"""Seconds the watcher may note a death late (it polls five times a second, on a busy host)."""

TIMEOUT_SLACK = 1.0
"""Seconds after a hanging run's timeout during which its worker may not yet have ended it: the worker looks at
its sync runs' deadlines every 0.2 s on its event loop, which a loaded host delays (the soak saw 0.9 s). A process
that died within it may have died before the timeout was seen: its run is lost, not ended."""

LOST, UNSETTLED = "lost", "unsettled"
DIED, CONTACT = "died", "lost contact"
"""Why a run's outcome may never have been settled: its process died, or lost contact with Redis."""


def is_lost(run: Run, kind: Kind | None, died: Mapping[int, float | None], abrupt: set[int]) -> str | None:
    """``lost`` when this run's process died under it: no end, and its process gone without a clean stop. A
    hanging run normally has no end (its timeout abandons it): it is lost only if its process died before the
    timeout. None otherwise (a run with an end is never a death, however soon its process died after)."""
    if run.ended is not None or run.pid not in abrupt:
        return None
    if kind is not None and kind.hang:
        at = died.get(run.pid)
        return LOST if at is not None and at < run.started + HANG_TIMEOUT + TIMEOUT_SLACK else None
    return LOST


def outcome_lost(run: Run, until: float, died: Mapping[int, float | None], abrupt: set[int],
                 cut_off: Sequence[tuple[float, float]], ended: float | None = None) -> str | None:
    """The evidence that a run which ended had its outcome lost: its process died without a clean stop (``died``),
    or the workers were cut off from Redis (``lost contact``), after the run ended and before ``until`` (the
    job's next run, or its dead-letter entry: had the outcome been settled, neither would have come). None: no
    such evidence, so whatever came next cannot be blamed on a lost outcome. ``ended``: when the run ended, if
    not by its end line (a hanging run, ended by its timeout: ``timed_out``)."""
    ended = run.ended if ended is None else ended
    if ended is None:
        return None
    if run.pid in abrupt:
        at = died.get(run.pid)
        if at is None or ended <= at <= until + WATCH_SLACK:
            return DIED
    if any(start <= until and end >= ended for start, end in cut_off):
        return CONTACT
    return None


def timed_out(run: Run, kind: Kind, died: Mapping[int, float | None], abrupt: set[int]) -> float | None:
    """When a hanging run, with no end line, was ended by its timeout (its worker wrote a ``JobTimeout`` outcome
    then): the timeout, unless its process died first (then the run was lost, not ended). None otherwise."""
    if run.ended is not None or not kind.hang or is_lost(run, kind, died, abrupt) is not None:
        return None
    return run.started + HANG_TIMEOUT


def charged_deaths(runs: list[Run], kind: Kind, died: Mapping[int, float | None], abrupt: set[int]) -> int:
    """Lost runs the engine charged: those followed by no later run with the same attempt number.

    A run whose start-journal mark never reached Redis (its process died
    first, or Redis was restarting) comes back uncharged, and its job runs
    again with the same attempt number; the engine catches a job that keeps
    doing that by its recovery count (``retry.RECOVERIES_BEFORE_PANIC``), not
    by its deaths, so only charged deaths count against the poison-pill limit.
    """
    ordered = sorted(runs, key=lambda r: r.started)
    charged = 0
    for i, run in enumerate(ordered):
        if is_lost(run, kind, died, abrupt) == LOST and not any(
                later.attempt == run.attempt for later in ordered[i + 1:]):
            charged += 1
    return charged


def run_end(run: Run, kind: Kind | None, died: Mapping[int, float | None], abrupt: set[int]) -> float | None:
    """When a run stopped being under way: its end; a hanging run's timeout; the death of a process that died
    under it. None when that cannot be told (its process's death was not watched, or it stopped cleanly)."""
    if run.ended is not None:
        return run.ended
    if kind is not None and kind.hang:
        return run.started + HANG_TIMEOUT
    return died.get(run.pid) if run.pid in abrupt else None


def at_once(runs: list[Run], kind: Kind | None, died: Mapping[int, float | None], abrupt: set[int],
            cut_off: Sequence[tuple[float, float]]) -> list[tuple[Run, Run]]:
    """Pairs of runs of one job under way at the same time, the first in a process that had not lost contact.

    At least once never means twice at once: a job's entry goes to another
    worker only when its holder's lease lapsed, which a live process only
    lets happen when it is cut off from Redis.
    """
    out = []
    for i, first in enumerate(runs):
        stop = run_end(first, kind, died, abrupt)
        if stop is None:
            continue
        for later in runs[i + 1:]:
            if later.started >= stop:
                break
            if not any(start <= later.started and end >= first.started for start, end in cut_off):
                out.append((first, later))
    return out


def most_at_once(runs: list[Run]) -> int:
    """The most runs under way at one moment, from their start and end times (an end before a start at a tie)."""
    edges = sorted([(r.started, 1) for r in runs] + [(r.ended, -1) for r in runs if r.ended is not None])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


RATE_SLACK_S = 0.05
"""How much shorter than a second the starts of a rate limit's N + 1 runs may span: a start is written to the
ledger by the run itself, a moment after its worker started it, and a busy host stretches that moment."""


def most_in_a_second(starts: list[float]) -> int:
    """The most of these sorted start times within one second (less ``RATE_SLACK_S``)."""
    most = 0
    first = 0
    for last, at in enumerate(starts):
        while at - starts[first] >= 1.0 - RATE_SLACK_S:
            first += 1
        most = max(most, last - first + 1)
    return most
