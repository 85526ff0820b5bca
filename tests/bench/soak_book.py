"""A made-up soak for the verdict tests: ledger lines written through the soak's own writer, dead-letter entries
and process deaths, and the clean book every case starts from.
"""

from __future__ import annotations

import json

from bench.soak.kinds import KINDS
from bench.soak.ledger import parse
from bench.soak.verdict import DeadEntry, Evidence, judge


T0 = 1_800_000_000.0
ALIVE_PID, KILLED_PID, GRACEFUL_PID, CRASHED_PID = 100, 200, 300, 400


class Book:
    """Ledger lines, dead-letter entries and process deaths for one made-up soak."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.dead: list[DeadEntry] = []
        self.dead_pids: dict[int, float | None] = {}
        self.killed: set[int] = set()
        self.results: dict[str, str | None] | None = None
        self.leftovers: dict[str, dict[str, int]] = {}
        self.fires: dict[str, int] = {}
        self.missed: dict[str, int] = {}
        self.cut_off: list[tuple[float, float]] = []
        self._runs = 0
        self._attempts: dict[str, int] = {}

    def _line(self, **rec) -> None:
        self.lines.append(json.dumps(rec))

    def enqueue(self, job_id: str, kind: str) -> str:
        self._line(j=job_id, k=kind, e="enqueue", t=T0, p=1)
        return job_id

    def run(self, job_id: str, kind: str, *, at: float, outcome: str | None = "ok", pid: int = ALIVE_PID,
            error_class: str = "", took: float = 0.1, attempt: int | None = None) -> None:
        self._runs += 1
        run_id = f"r{self._runs}"
        self._attempts[job_id] = attempt = attempt or self._attempts.get(job_id, 0) + 1
        self._line(j=job_id, k=kind, e="start", r=run_id, a=attempt, p=pid, t=T0 + at)
        if outcome is not None:
            self._line(j=job_id, k=kind, e="end", r=run_id, o=outcome, x=error_class, p=pid, t=T0 + at + took)

    def replay(self, job_id: str, kind: str, *, reset: bool) -> None:
        self._line(j=job_id, k=kind, e="replay", reset=reset, t=T0, p=1)

    def dies(self, job_id: str, reason: str, error_class: str = "SoakFailure", queue: str = "soak-b", *,
             at: float = 100.0) -> None:
        entry_id = f"{int((T0 + at) * 1000)}-{len(self.dead)}"
        self.dead.append(DeadEntry(job_id, queue, reason, error_class, entry_id, "boom"))

    def process_died(self, pid: int, at: float | None, *, killed: bool = False) -> None:
        self.dead_pids[pid] = None if at is None else T0 + at
        if killed:
            self.killed.add(pid)
        else:
            self.killed.discard(pid)

    def exited(self, pid: int, at: float) -> None:
        """The process stopped cleanly: its exit line, and the watcher saw it gone."""
        self._line(e="exit", p=pid, t=T0 + at)
        self.dead_pids[pid] = T0 + at

    def cut(self, start: float, end: float) -> None:
        """The network faults cut every worker off from Redis from ``start`` to ``end``."""
        self.cut_off.append((T0 + start, T0 + end))

    def judge(self):
        ev = Evidence(parse(self.lines), {k.name: k for k in KINDS}, self.dead, self.dead_pids, self.killed,
                      self.results, self.leftovers, self.fires, self.cut_off, self.missed)
        return judge(ev)


def what(verdict) -> list[tuple[str, str]]:
    return sorted((d.what, d.job_id) for d in verdict.discrepancies)


def a_clean_book() -> Book:
    b = Book()
    b.enqueue("ok-1", "ok")
    b.run("ok-1", "ok", at=1)
    b.enqueue("fail-1", "always_fail")
    for i in range(3):
        b.run("fail-1", "always_fail", at=1 + i, outcome="error", error_class="SoakFailure")
    b.dies("fail-1", "retries_exhausted")
    b.enqueue("once-1", "fail_once")
    b.run("once-1", "fail_once", at=1, outcome="error", error_class="SoakFailure")
    b.run("once-1", "fail_once", at=2)
    b.enqueue("crash-1", "crash")
    b.run("crash-1", "crash", at=1, outcome=None, pid=CRASHED_PID)
    b.run("crash-1", "crash", at=8, outcome=None, pid=CRASHED_PID + 1)
    b.process_died(CRASHED_PID, 1.01)
    b.process_died(CRASHED_PID + 1, 8.01)
    b.dies("crash-1", "panic", "WorkerLost", "soak-c")
    b.enqueue("hang-1", "hang_sync")
    b.run("hang-1", "hang_sync", at=1, outcome=None)
    b.run("hang-1", "hang_sync", at=4, outcome=None)
    b.dies("hang-1", "retries_exhausted", "chasqui_core.engine.jobs.errors.JobTimeout")
    b.fires = {"soak-tick": 1}
    b.run("schedule:soak-tick:1795000000000", "scheduled", at=3)
    return b
