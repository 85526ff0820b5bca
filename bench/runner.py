"""Running a selection of scenarios: the server, the ceiling, repeats and medians."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import ceiling, report
from .machine import describe, machine_info
from .results import BenchError, Measurement
from .scenarios import twin as twin_of
from .server import BenchServer


@dataclass
class Context:
    """What every scenario gets: the server, the run's sizes and repeats."""

    server: BenchServer
    smoke: bool
    repeats: int
    queue: str = "bench"
    out: TextIO = field(default_factory=lambda: sys.stdout)
    results: list[Measurement] = field(default_factory=list)
    """Measurements made so far in this run (a later scenario may build on them)."""

    @property
    def client(self):
        return self.server.client

    @property
    def url(self) -> str:
        return self.server.url

    def size(self, full: int, smoke: int) -> int:
        return smoke if self.smoke else full

    def warmup_size(self, n: int) -> int:
        return max(min(n, 50), n // 4) if self.smoke else max(min(n, 200), n // 10)

    def flush(self) -> None:
        self.server.flush()

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def repeat(self, once: Callable[[int], Any], n: int) -> list[Any]:
        """Empty the database, run a warm-up, then ``repeats`` measured runs of ``n``; return the measured ones."""
        self.flush()
        once(self.warmup_size(n))
        measured = []
        for _ in range(self.repeats):
            self.flush()
            measured.append(once(n))
        return measured

    def rates(self, once: Callable[[int], tuple[int, float]], n: int) -> list[float]:
        """``once(n)`` returns (jobs, seconds) of its measured window; rates of the measured repeats."""
        return [jobs / seconds for jobs, seconds in self.repeat(once, n)]

    def find(self, label: str, system: str = "chasqui") -> Measurement | None:
        for m in self.results:
            if m.label == label and m.system == system and m.samples:
                return m
        return None


@dataclass
class Run:
    machine: dict
    server: dict
    smoke: bool
    repeats: int
    command: str
    started_at: float
    measurements: list[Measurement]
    failures: dict[str, str]
    seconds: float = 0.0

    @property
    def ceiling(self) -> float | None:
        for m in self.measurements:
            if m.scenario == "ceiling":
                return m.median
        return None


def run(scenarios, *, smoke: bool, repeats: int, url: str | None, allow_flush: bool, command: str,
        out: TextIO = sys.stdout) -> Run:
    started = time.time()
    t0 = time.perf_counter()
    machine = machine_info()
    with BenchServer(url, allow_flush=allow_flush) as server:
        server.export_url()
        info = server.info()
        ctx = Context(server, smoke, repeats, out=out)
        ctx.say(f"Machine: {describe(machine)}")
        ctx.say(f"Server:  {info.describe()}")
        if info.appendonly != "no":
            ctx.say("         note: the append-only file is not off on this server; writes also cost fsyncs")
        mode = ("smoke (tiny sizes, 1 repeat: proves the suite works, the numbers mean little)" if smoke
                else f"median of {repeats} repeats after an uncounted warm-up")
        ctx.say(f"Mode:    {mode}")
        the_run = Run(machine, info.to_dict(), smoke, repeats, command, started, [], {})
        ctx.say("\n== ceiling: pipelined XADD rate of this server")
        top = ceiling.measure(server, total=ctx.size(200_000, 20_000), repeats=repeats)
        ctx.results.append(top)
        the_run.measurements.append(top)
        ctx.say(report.line(top, None))
        for scenario in scenarios:
            ctx.say(f"\n== {scenario.name}: {scenario.summary}")
            s0 = time.perf_counter()
            try:
                produced = scenario.run(ctx)
            except (BenchError, Exception) as exc:  # one broken scenario must not hide the others
                detail = str(exc) if isinstance(exc, BenchError) else traceback.format_exc()
                the_run.failures[scenario.name] = detail
                ctx.say(f"   FAILED: {detail}")
                continue
            for m in produced:
                ctx.results.append(m)
                the_run.measurements.append(m)
                twin = twin_of(m.label)
                ctx.say(report.line(m, top.median, ctx.find(twin) if twin else None))
            ctx.say(f"   ({time.perf_counter() - s0:.1f} s)")
        server.flush()  # leave the database as empty as it was found
    the_run.seconds = time.perf_counter() - t0
    return the_run
