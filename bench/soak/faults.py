"""The faults the soak injects, when, and the watcher that notes when each worker process died.

The timeline is fixed by the seed before the run starts, so a failing run
can be repeated: one fault every ``every`` seconds from ``first`` until the
last sixth of the workload, each round going through every fault once in
a shuffled order (a short run still sees each of them).

With ``--network-faults`` the workers reach Redis through the soak's fault
proxy (bench/faultproxy.py) and a second timeline, offset by half a period,
goes through the network faults the same way: latency, a blackhole and
refused connections past the visibility timeout, resets, half-open links.
One network fault is in effect at a time; the windows during which the
workers were cut off from Redis are what the verdict accepts as lost
contact (``cut_off``): a blackhole or a refusal while it lasts, half-open
links until the workers closed the last of them, and, with or without the
proxy, each Redis restart from its shutdown until the server answers again.

The watcher polls the process table five times a second and remembers the
pid of every worker process it saw, and when it stopped existing. That is
what tells a run lost with its process from one that is still going (the
verdict's ``dead_pids``); a worker process lives seconds at the very least
(Django starts first), so none goes unseen.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from chasqui_core.engine.ops import stats

from ..faultproxy import FaultProxy
from .server import SoakServer
from .workers import WorkerSupervisor, alive, process_table

FAULTS = ("kill_child", "kill_supervisor", "sighup", "redis_restart", "pause_resume")
NETWORK_FAULTS = ("latency", "blackhole", "reset", "refuse", "half_open")
"""Through the fault proxy, with ``--network-faults``."""
LATENCY = 0.2
"""Seconds added each way (a 400 ms round trip) during a ``latency`` fault."""
LATENCY_SECONDS = 10.0
PAST_VISIBILITY = 3.0
"""A blackhole or a refusal lasts the visibility timeout and this many seconds more: the workers' leases lapse."""
HALF_OPEN_WINDOW = 30.0
"""Most seconds after links went half-open that the workers count as cut off: until the last of those links is
closed by its client (the proxy sees it), and no longer than this. A worker that never notices shows as a queue not
drained."""
PAUSE_SECONDS = 3.0
REDIS_DOWN_SECONDS = 2.0
"""How long Redis stays shut down: long enough for every worker and the producer to notice, short enough for an
enqueue to ride it out within the engine's retry window (5 s)."""


def plan(seconds: float, rng: random.Random, *, every: float = 12.0, network: bool = False
         ) -> list[tuple[float, str]]:
    """The whole fault timeline: the process and server faults, and with ``network`` the network faults between
    them (their own rounds, half a period later), in time order."""
    out = timeline(seconds, rng, every=every)
    if network:
        out += timeline(seconds, rng, first=10.0 + every / 2, every=every, kinds=NETWORK_FAULTS)
    return sorted(out)


def timeline(seconds: float, rng: random.Random, *, first: float = 10.0, every: float = 12.0,
             kinds: tuple[str, ...] = FAULTS) -> list[tuple[float, str]]:
    """(offset in seconds, fault) pairs over the workload, every fault once per round, rounds shuffled."""
    out: list[tuple[float, str]] = []
    at, last = first, seconds * 5 / 6
    while at <= last:
        round_ = list(kinds)
        rng.shuffle(round_)
        for fault in round_:
            if at > last:
                break
            out.append((at, fault))
            at += every
    return out


@dataclass(frozen=True, slots=True)
class Injected:
    at: float
    """Seconds since the workload started."""
    fault: str
    detail: str


class Watcher(threading.Thread):
    """Notes every worker process (the supervisor's children, past and present) and when each one died."""

    def __init__(self, supervisor: WorkerSupervisor, interval: float = 0.2) -> None:
        super().__init__(name="soak-watcher", daemon=True)
        self.supervisor = supervisor
        self.interval = interval
        self.seen: dict[int, float] = {}
        self.died: dict[int, float] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            self.poll()
            self._halt.wait(self.interval)

    def poll(self) -> None:
        table = process_table()
        now = time.time()
        with self._lock:
            for pid in self.supervisor.children(table):
                self.seen.setdefault(pid, now)
            for pid in self.seen:
                if pid not in self.died and not alive(pid, table):
                    self.died[pid] = now

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.poll()

    def dead_pids(self, ledger_pids: set[int]) -> dict[int, float | None]:
        """Every process that is gone: with its time of death when it was watched, None otherwise."""
        with self._lock:
            out: dict[int, float | None] = dict(self.died)
        table = process_table()
        for pid in ledger_pids:
            if pid not in out and not alive(pid, table):
                out[pid] = None
        return out


class Injector:
    """Carries out the faults of the timeline, noting each one; the run loop calls ``due`` often."""

    def __init__(self, plan: list[tuple[float, str]], supervisor: WorkerSupervisor, server: SoakServer,
                 client_factory: Callable[[], object], queues: list[str], rng: random.Random,
                 say: Callable[[str], None], *, proxy: FaultProxy | None = None,
                 visibility_timeout: float = 5.0) -> None:
        self.plan = list(plan)
        self.proxy = proxy
        self.visibility_timeout = visibility_timeout
        self.cut_off: list[tuple[float, float]] = []
        """(start, end), ``time.time()``: when the network faults cut the workers off from Redis."""
        self._heal: tuple[float, float | None] | None = None
        """(offset to heal at, wall time the cut began, None when the fault cut nothing off)."""
        self._half_open: tuple[float, float] | None = None
        """(offset, wall time) when links were last made half-open, while some of them are left."""
        self.supervisor = supervisor
        self.server = server
        self.client_factory = client_factory
        self.queues = queues
        self.rng = rng
        self.say = say
        self.done: list[Injected] = []
        self.killed: set[int] = set()
        """Worker processes killed with SIGKILL."""
        self._resume: tuple[float, str] | None = None

    def due(self, elapsed: float) -> None:
        if self._resume is not None and elapsed >= self._resume[0]:
            self._do_resume(elapsed)
        if self._heal is not None and elapsed >= self._heal[0]:
            self._do_heal(elapsed)
        if self._half_open is not None:
            self._half_open_over(elapsed)
        while self.plan and self.plan[0][0] <= elapsed:
            _, fault = self.plan.pop(0)
            try:
                detail = getattr(self, fault)(elapsed)
            except Exception as exc:  # a fault that could not be carried out is reported, not fatal
                detail = f"could not be injected: {type(exc).__name__}: {exc}"
            self.done.append(Injected(elapsed, fault, detail))
            self.say(f"  [{elapsed:6.1f} s] {fault}: {detail}")

    def finish(self, elapsed: float) -> None:
        """Undo what is still in effect (a paused queue) before the drain."""
        self.plan.clear()
        if self._resume is not None:
            self._do_resume(elapsed)
        if self._heal is not None:
            self._do_heal(elapsed)
        if self._half_open is not None:
            self._half_open_over(elapsed, finished=True)

    def kill_child(self, elapsed: float) -> str:
        kids = self.supervisor.children()
        if not kids:
            return "no worker process to kill (all restarting)"
        pid = self.rng.choice(kids)
        os.kill(pid, signal.SIGKILL)
        self.killed.add(pid)
        return f"SIGKILL to worker process {pid}"

    def kill_supervisor(self, elapsed: float) -> str:
        old = self.supervisor.pid
        kids = self.supervisor.kill()
        new = self.supervisor.start()
        return f"SIGKILL to supervisor {old} (children {kids} stop by themselves); started supervisor {new}"

    def sighup(self, elapsed: float) -> str:
        kids = self.supervisor.children()
        if not kids:  # still starting (a supervisor just started again): before its handler is set, SIGHUP ends it
            return "no SIGHUP: the supervisor has no worker process yet (still starting)"
        self.supervisor.signal(signal.SIGHUP)
        return f"SIGHUP to supervisor {self.supervisor.pid} (rolling reload of {kids})"

    def redis_restart(self, elapsed: float) -> str:
        """Every worker is cut off while the server is away: an outcome on its way when it shut down is lost with
        the connection, and a worker whose lease lapsed meanwhile has its jobs run again elsewhere (lost contact)."""
        began = time.time()
        away = self.server.restart(down_for=REDIS_DOWN_SECONDS)
        self.cut_off.append((began, time.time()))
        return f"SHUTDOWN, restarted on port {self.server.port} from its AOF: away {away:.2f} s"

    def pause_resume(self, elapsed: float) -> str:
        queue = self.rng.choice(self.queues)
        stats.pause(self.client_factory(), queue)
        self._resume = (elapsed + PAUSE_SECONDS, queue)
        return f"paused {queue} for {PAUSE_SECONDS:.0f} s"

    # --- network faults, through the proxy --------------------------------------------------------------

    def _network(self, elapsed: float, lasts: float, cuts_off: bool) -> FaultProxy:
        if self.proxy is None:
            raise RuntimeError("no fault proxy: run with --network-faults")
        if self._heal is not None:
            self._do_heal(elapsed)
        self._heal = (elapsed + lasts, time.time() if cuts_off else None)
        return self.proxy

    def latency(self, elapsed: float) -> str:
        self._network(elapsed, LATENCY_SECONDS, cuts_off=False).set_latency(LATENCY)
        return f"{LATENCY * 1000:.0f} ms each way for {LATENCY_SECONDS:.0f} s"

    def blackhole(self, elapsed: float) -> str:
        lasts = self.visibility_timeout + PAST_VISIBILITY
        self._network(elapsed, lasts, cuts_off=True).blackhole()
        return f"nothing forwarded either way for {lasts:.0f} s (past the visibility timeout)"

    def refuse(self, elapsed: float) -> str:
        lasts = self.visibility_timeout + PAST_VISIBILITY
        self._network(elapsed, lasts, cuts_off=True).refuse()
        return f"links reset and connections refused for {lasts:.0f} s (past the visibility timeout)"

    def reset(self, elapsed: float) -> str:
        n = self._network(elapsed, 0.0, cuts_off=False).reset()
        return f"{n} link(s) reset"

    def half_open(self, elapsed: float) -> str:
        proxy = self._network(elapsed, 0.0, cuts_off=False)
        if self._half_open is not None:
            self._half_open_over(elapsed, finished=True)
        began = time.time()
        n = proxy.half_open()
        self._half_open = (elapsed, began)
        return f"{n} link(s) half-open (the server's side gone, the workers' silent)"

    def _half_open_over(self, elapsed: float, *, finished: bool = False) -> None:
        """Close the half-open window once the workers closed every such link, or at its longest."""
        assert self._half_open is not None and self.proxy is not None
        since, began = self._half_open
        left = self.proxy.state().half_open
        if left and not finished and elapsed < since + HALF_OPEN_WINDOW:
            return
        self._half_open = None
        ended = min(time.time(), began + HALF_OPEN_WINDOW)
        self.cut_off.append((began, ended))
        what = f"{left} link(s) still half-open, cut off for" if left else "every half-open link closed after"
        self.say(f"  [{elapsed:6.1f} s] {what} {ended - began:.1f} s")

    def _do_heal(self, elapsed: float) -> None:
        assert self._heal is not None and self.proxy is not None
        began = self._heal[1]
        self.proxy.heal()
        self._heal = None
        if began is not None:
            self.cut_off.append((began, time.time()))
            self.say(f"  [{elapsed:6.1f} s] network healed")

    def _do_resume(self, elapsed: float) -> None:
        assert self._resume is not None
        queue = self._resume[1]
        try:
            stats.resume(self.client_factory(), queue)
        except Exception as exc:  # Redis away at this instant: try again on the next call
            self.say(f"  [{elapsed:6.1f} s] resume {queue} failed ({exc}); trying again")
            return
        self._resume = None
        self.say(f"  [{elapsed:6.1f} s] resumed {queue}")
