"""The ledger: what ran, and what was enqueued and replayed, kept outside Redis.

The soak's faults include Redis going away, so what the queue itself says
cannot be the only witness. Every run of a task appends a line here when it
starts and when it ends, and the producer appends a line for every job it
enqueues and every dead job it replays. At the end the verdict compares
this ledger with what Redis holds.

A line is one JSON object, written with a single ``os.write`` to a file
opened with ``O_APPEND``: Linux appends such a write whole, so lines from
both worker processes, their threads and the producer never interleave,
and a process killed with SIGKILL leaves at most its last line unwritten,
never half of one (a torn line would be skipped and reported anyway).

Fields (short, since there is a line per run): ``j`` job id, ``k`` kind,
``e`` event (``start``, ``end``, ``enqueue``, ``replay``, ``exit``: a worker
process stopping cleanly, written as its interpreter exits), ``r`` the run's id
(pairs a start with its end), ``a`` attempt (``context.attempt``), ``p`` pid,
``t`` time (``time.time()``; an enqueue's is when its first send began, since a
worker may read, start and lose the job before the send returns), ``o`` outcome of an end (``ok``, ``error``,
``cancelled``), ``x`` the error class of a failed run, ``reset`` whether a
replay gave the job its whole budget again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

START, END, ENQUEUE, REPLAY, EXIT = "start", "end", "enqueue", "replay", "exit"
OK, ERROR, CANCELLED = "ok", "error", "cancelled"


class LedgerWriter:
    """Appends records to one ledger file, one ``os.write`` per line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **record: object) -> None:
        record.setdefault("p", os.getpid())
        record.setdefault("t", time.time())
        line = json.dumps(record, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


@dataclass(slots=True)
class Run:
    """One run of a job, from its start line and, if it came, its end line."""

    run_id: str
    job_id: str
    kind: str
    attempt: int
    pid: int
    started: float
    ended: float | None = None
    outcome: str | None = None
    error_class: str = ""

    def line(self) -> str:
        end = (f"ended {self.outcome}{' ' + self.error_class if self.error_class else ''} at {self.ended:.3f}"
               if self.ended is not None else "no end")
        return f"run {self.run_id} attempt {self.attempt} pid {self.pid} started {self.started:.3f}, {end}"


@dataclass(slots=True)
class Ledger:
    """Everything the ledger files say, grouped by job."""

    enqueued: dict[str, str] = field(default_factory=dict)
    """Job id -> kind, for every job the producer enqueued."""
    enqueued_at: dict[str, float] = field(default_factory=dict)
    replays: dict[str, list[bool]] = field(default_factory=dict)
    """Job id -> one entry per replay: True when it reset the budget, False for one more attempt."""
    replayed_at: dict[str, list[float]] = field(default_factory=dict)
    """Job id -> the time of each replay, in the order of ``replays``."""
    runs: dict[str, list[Run]] = field(default_factory=dict)
    """Job id -> its runs, in the order they started."""
    torn: list[str] = field(default_factory=list)
    """Lines that are not a whole record (should never happen: reported as a discrepancy)."""
    orphan_ends: list[dict] = field(default_factory=list)
    """End lines without a start line (should never happen either)."""
    exits: dict[int, float] = field(default_factory=dict)
    """Pid -> when that worker process stopped cleanly (its interpreter ran its exit handlers)."""


def parse(lines: Iterable[str]) -> Ledger:
    """Group ledger lines by job; lines may come from several files in any order."""
    ledger = Ledger()
    ends: dict[str, dict] = {}
    for raw in lines:
        text = raw.strip()
        if not text:
            continue
        try:
            rec = json.loads(text)
            event = rec["e"]
            job_id = rec["j"] if event != EXIT else ""
        except (ValueError, KeyError, TypeError):
            ledger.torn.append(text[:200])
            continue
        if event == EXIT:
            ledger.exits[int(rec.get("p", 0))] = float(rec.get("t", 0.0))
        elif event == ENQUEUE:
            ledger.enqueued[job_id] = rec["k"]
            ledger.enqueued_at[job_id] = rec.get("t", 0.0)
        elif event == REPLAY:
            ledger.replays.setdefault(job_id, []).append(bool(rec.get("reset")))
            ledger.replayed_at.setdefault(job_id, []).append(float(rec.get("t", 0.0)))
        elif event == START:
            ledger.runs.setdefault(job_id, []).append(
                Run(rec["r"], job_id, rec.get("k", ""), int(rec.get("a", 0)), int(rec.get("p", 0)),
                    float(rec.get("t", 0.0))))
        elif event == END:
            ends[rec["r"]] = rec
        else:
            ledger.torn.append(text[:200])
    by_run = {run.run_id: run for runs in ledger.runs.values() for run in runs}
    for run_id, rec in ends.items():
        run = by_run.get(run_id)
        if run is None:
            ledger.orphan_ends.append(rec)
            continue
        run.ended = float(rec.get("t", 0.0))
        run.outcome = rec.get("o")
        run.error_class = rec.get("x", "")
    for runs in ledger.runs.values():
        runs.sort(key=lambda r: r.started)
    return ledger


def read(paths: Iterable[str]) -> Ledger:
    def lines() -> Iterator[str]:
        for path in paths:
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    yield from f
    return parse(lines())
