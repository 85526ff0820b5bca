"""``runworker --processes N``: one supervisor process keeping N worker processes running.

One Python process runs one event loop on one core, so a machine with more
cores runs more worker processes. This module is the small process that
starts them, replaces the ones that die, recycles them on request, reloads
them one by one on SIGHUP, and stops them all on SIGTERM. It imports no task
code and runs no job: a bug in a task can kill a child, never the supervisor.

Why children are ``manage.py runworker`` subprocesses rather than
``multiprocessing`` children:

- a child is exactly today's single-process worker, started the way an
  operator starts one, with the same options and log lines; there is no
  second code path to keep in step;
- every child is a fresh interpreter that imports the code on disk, which is
  what a reload on SIGHUP needs (a forked child would carry the supervisor's
  old modules, and spawn would re-run ``manage.py`` through pickling, for
  nothing we need);
- the supervisor shares no locks, queues or pickled state with its children:
  a child killed at any instant cannot leave it stuck.

The few things the two sides say to each other go through the environment
(``CHASQUI_SUPERVISOR_PID``), one pipe per child (``READY``, a byte, once the
child reads its queues; ``SUCCESSOR``, once it has reached a limit and wants a
fresh process in its place), signals, and the exit code (``RECYCLE_EXIT_CODE``
means "I stopped on purpose after my job or memory limit: replace me now", what
a child does when it cannot ask).

A child is replaced by starting its successor first and stopping it only once
the successor reads (a *handover*): on SIGHUP, every slot in turn, and when a
child asks, its own slot. One handover runs at a time, and the next waits until
the process it replaced has exited, so there are never more than N + 1 worker
processes. A recycling child goes on taking jobs meanwhile: a queue is never
left unread for the length of a process start.

A child notices its supervisor's death without help: Linux sends it SIGTERM
(``PR_SET_PDEATHSIG``), and a thread checks ``os.getppid()`` every second
everywhere else; either way it stops as gracefully as on a plain SIGTERM, so
no worker outlives its supervisor, even one killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field

from chasqui_core.supervised_child import (READY, READY_FD_ENV, RECYCLE_EXIT_CODE, STOPPED_EXIT_CODE, SUCCESSOR,
                                           SUPERVISOR_PID_ENV)
from chasqui_core.supervisor_rules import SupervisorConfig, describe_exit, restart_delay

logger = logging.getLogger("chasqui.supervisor")

RELOAD, RECYCLE = "reload", "recycle"
"""Why a handover replaces a child: a SIGHUP, or the child's own request."""
KILL_GRACE = 5.0
"""Seconds a stopping child gets beyond its shutdown timeout (settling, closing Django) before SIGKILL."""
KILLED = float("inf")
"""``_Child.kill_at`` of a child already sent SIGKILL."""


@dataclass(slots=True)
class _Child:
    slot: int
    process: subprocess.Popen
    ready_pipe: int
    """Read end of the pipe the child writes ``READY`` and ``SUCCESSOR`` on; -1 once closed (at end of file)."""
    started_at: float = field(default_factory=time.monotonic)
    ready: bool = False
    role: str = "active"
    """``active`` (serving its slot), ``successor`` (started by a handover, not serving yet), ``retiring``
    (replaced, finishing its jobs) or ``discarded`` (a successor given up before it was ready)."""
    wants_successor: bool = False
    """It asked for a successor (a child asks once; a second request is ignored)."""
    kill_at: float | None = None
    """When a stopping child is killed if it has not exited by then."""

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(slots=True)
class _Slot:
    deaths: int = 0
    """Quick deaths in a row (children that died before ``stable_after`` and before they were ready)."""
    start_at: float | None = 0.0
    """When to start the slot's next child; None while a child serves it."""
    retired: bool = False
    """An operator stopped the slot's child: nothing is started in it again."""


@dataclass(slots=True)
class _Handover:
    """A slot's child to be replaced by a successor that is started, and ready, before it is told to stop."""

    slot: int
    why: str
    """``RELOAD`` (SIGHUP) or ``RECYCLE`` (the child asked)."""
    predecessor: int | None = None
    """For a recycle, the pid of the child that asked; a reload replaces whichever child serves the slot."""
    successor: _Child | None = None
    not_before: float = 0.0
    """A recycle whose successor failed is tried again from then on."""
    failures: int = 0


class Supervisor:
    """Keeps ``config.processes`` copies of ``config.command`` running until SIGTERM or SIGINT."""

    def __init__(self, config: SupervisorConfig, *, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.env = dict(os.environ if env is None else env)
        self._children: dict[int, _Child] = {}
        self._slots = [_Slot() for _ in range(config.processes)]
        self._stop_signals = 0
        self._reload_requested = False
        self._handovers: list[_Handover] = []
        """Waiting to begin, in order; the one under way is ``_handover``."""
        self._handover: _Handover | None = None
        self._wakeup_read = -1

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until asked to stop; returns the exit code (0: every child stopped)."""
        self._install_signal_handlers()
        logger.info("supervisor %d: keeping %d worker process(es) running: %s", os.getpid(), self.config.processes,
                    " ".join(self.config.command))
        try:
            while not self._stop_signals and not self._all_retired():
                self._start_due_slots()
                self._wait(0.5)
                self._reap()
                self._forgive_stable_children()
                self._kill_overdue()
                if self._reload_requested:
                    self._begin_reload()
                self._advance_handover()
        finally:  # asked to stop, or something went wrong here: either way no child is left behind
            self._stop_all()
            self._restore_signal_handlers()
        logger.info("supervisor %d: stopped", os.getpid())
        return 0

    def _all_retired(self) -> bool:
        """Every slot's child was stopped by an operator: the supervisor has nothing left to keep running."""
        if all(slot.retired for slot in self._slots) and not self._children:
            logger.info("supervisor %d: every worker process was stopped by an operator; exiting", os.getpid())
            return True
        return False

    def _install_signal_handlers(self) -> None:
        """Signals only set flags; the loop wakes up at once through the wake-up pipe and acts on them."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._wakeup_read, self._wakeup_write = read, write
        self._previous_wakeup = signal.set_wakeup_fd(write)
        self._previous_handlers = {
            sig: signal.signal(sig, handler) for sig, handler in (
                (signal.SIGTERM, self._on_stop_signal), (signal.SIGINT, self._on_stop_signal),
                (signal.SIGHUP, self._on_reload_signal), (signal.SIGCHLD, lambda *_: None),
            )
        }

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self._wakeup_read)
        os.close(self._wakeup_write)

    def _on_stop_signal(self, signum: int, _frame) -> None:
        self._stop_signals += 1

    def _on_reload_signal(self, signum: int, _frame) -> None:
        self._reload_requested = True

    def _wait(self, timeout: float) -> None:
        """Sleep until a signal, a child's message or ``timeout``; act on the messages."""
        pipes = {c.ready_pipe: c for c in self._children.values() if c.ready_pipe >= 0}
        readable, _, _ = select.select([self._wakeup_read, *pipes], [], [], timeout)
        for fd in readable:
            if fd == self._wakeup_read:
                while True:
                    try:
                        if not os.read(fd, 512):
                            break
                    except BlockingIOError:
                        break
                continue
            child = pipes[fd]
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b""
            if not data:  # end of file: the child exited (or closed it); it has said all it will
                os.close(fd)
                child.ready_pipe = -1
                continue
            if READY in data and not child.ready:
                child.ready = True
                logger.info("worker process %d (slot %d) is ready", child.pid, child.slot)
            if SUCCESSOR in data:
                self._on_successor_request(child)

    # --- starting and replacing ------------------------------------------------------------------

    def _spawn(self, slot: int, role: str, why: str = "") -> _Child:
        read, write = os.pipe()
        env = {**self.env, SUPERVISOR_PID_ENV: str(os.getpid()), READY_FD_ENV: str(write)}
        try:
            # A process group of its own: a Ctrl-C or hang-up at the terminal reaches the supervisor
            # only, which then stops the children in order instead of all of them dying at once.
            process = subprocess.Popen(self.config.command, env=env, pass_fds=(write,), stdin=subprocess.DEVNULL,
                                       process_group=0)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        child = _Child(slot, process, read, role=role)
        self._children[child.pid] = child
        logger.info("started worker process %d (slot %d%s)", child.pid, slot, why)
        return child

    def _start_due_slots(self) -> None:
        now = time.monotonic()
        for number, slot in enumerate(self._slots):
            if slot.start_at is None or slot.start_at > now or self._successor_of(number):
                continue
            try:
                self._spawn(number, "active")
            except OSError as exc:
                slot.deaths += 1
                delay = max(self.config.restart_delay, restart_delay(slot.deaths, first=self.config.restart_delay,
                                                                     cap=self.config.max_restart_delay))
                slot.start_at = now + delay
                logger.error("could not start a worker process (slot %d): %s; trying again in %.0fs", number, exc,
                             delay)
                continue
            slot.start_at = None

    def _reap(self) -> None:
        for child in list(self._children.values()):
            code = child.process.poll()
            if code is None:
                continue
            del self._children[child.pid]
            if child.ready_pipe >= 0:
                self._hear_last_words(child)
                os.close(child.ready_pipe)
            self._on_exit(child, code)

    @staticmethod
    def _hear_last_words(child: _Child) -> None:
        """Read what an exited child wrote before it died and was not read yet: above all that it was ready."""
        while select.select([child.ready_pipe], [], [], 0)[0]:
            try:
                data = os.read(child.ready_pipe, 64)
            except OSError:
                return
            if not data:
                return
            if READY in data:
                child.ready = True

    def _on_exit(self, child: _Child, code: int) -> None:
        slot = self._slots[child.slot]
        how = describe_exit(code)
        if self.config.on_child_exit is not None:
            try:
                self.config.on_child_exit(child.pid, code)
            except Exception as exc:
                logger.warning("worker process %d %s; its death could not be recorded (%s: %s): the runs it had "
                               "under way are charged as lost contact", child.pid, how, type(exc).__name__, exc)
        if self._stop_signals:
            logger.info("worker process %d (slot %d) %s", child.pid, child.slot, how)
            return
        if child.role == "retiring":
            logger.info("worker process %d (slot %d, replaced by a fresh one) %s", child.pid, child.slot, how)
            return
        if child.role == "discarded":
            logger.info("worker process %d (slot %d, given up before it was ready) %s", child.pid, child.slot, how)
            return
        if child.role == "successor":
            self._successor_failed(child, f"{how} before it was ready")
            return
        if code == STOPPED_EXIT_CODE:
            logger.info("worker process %d (slot %d) was stopped by an operator; not starting another in its slot",
                        child.pid, child.slot)
            slot.retired = True
            slot.start_at = None
            return
        if code == RECYCLE_EXIT_CODE:
            logger.info("worker process %d (slot %d) recycled itself at its limit; starting a fresh one",
                        child.pid, child.slot)
            slot.deaths = 0
            slot.start_at = time.monotonic()
            return
        if child.ready:  # it read its queues: a job or a fault ended it, not a start that keeps failing
            slot.deaths = 0
        slot.deaths += 1
        delay = restart_delay(slot.deaths, first=self.config.restart_delay, cap=self.config.max_restart_delay)
        logger.warning("worker process %d (slot %d) %s; restarting %s", child.pid, child.slot, how,
                       f"in {delay:.0f}s ({slot.deaths} quick exits in a row)" if delay else "now")
        slot.start_at = time.monotonic() + delay

    def _forgive_stable_children(self) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.role == "active" and now - child.started_at >= self.config.stable_after:
                self._slots[child.slot].deaths = 0

    # --- handovers: reload (SIGHUP) and recycling ----------------------------------------------------

    def _begin_reload(self) -> None:
        self._reload_requested = False
        if any(h.why == RELOAD for h in self._all_handovers()):
            logger.info("reload requested while one is under way: the remaining slots are replaced anyway")
            return
        slots = [n for n, slot in enumerate(self._slots) if not slot.retired]  # stopped stay stopped
        self._handovers += [_Handover(n, RELOAD) for n in slots]
        logger.info("reloading: replacing %d worker process(es) one at a time", len(slots))

    def _on_successor_request(self, child: _Child) -> None:
        """A child reached its job or memory limit: queue a handover of its slot; it works on meanwhile."""
        if child.wants_successor:
            logger.warning("worker process %d (slot %d) asked for a successor again; it has one coming",
                           child.pid, child.slot)
            return
        child.wants_successor = True
        if child.role in ("retiring", "discarded") or self._stop_signals:
            return  # on its way out already
        logger.info("worker process %d (slot %d) reached its limit; it goes on while its successor starts",
                    child.pid, child.slot)
        self._handovers.append(_Handover(child.slot, RECYCLE, predecessor=child.pid))

    def _all_handovers(self) -> list[_Handover]:
        return [*self._handovers, *([self._handover] if self._handover is not None else [])]

    def _successor_of(self, slot: int) -> _Child | None:
        return next((c for c in self._children.values() if c.slot == slot and c.role == "successor"), None)

    def _replaced(self, handover: _Handover) -> list[_Child]:
        """The children a handover stops once its successor is ready."""
        if handover.why == RECYCLE:
            old = self._children.get(handover.predecessor or -1)
            return [old] if old is not None and old.role == "active" else []
        return [c for c in self._children.values() if c.slot == handover.slot and c.role == "active"]

    def _advance_handover(self) -> None:
        """One step of the handovers: a successor for the next, and once it is ready, the old child stops.

        A successor is started only while every other child is active (no old
        one still finishing its jobs, no given-up successor still exiting), so
        there is never more than one process above the count.
        """
        handover = self._handover
        if handover is None:
            self._begin_next_handover()
            return
        successor = handover.successor
        assert successor is not None  # set with ``_handover``
        if self._slots[handover.slot].retired:  # an operator stopped the old child meanwhile: the slot stays empty
            logger.info("stopping worker process %d: slot %d was stopped by an operator", successor.pid,
                        handover.slot)
            successor.role = "discarded"
            self._terminate(successor)
            self._handover = None
            return
        if not successor.ready:
            if time.monotonic() - successor.started_at > self.config.ready_timeout:
                successor.role = "discarded"
                self._terminate(successor)
                self._successor_failed(successor, f"was not ready after {self.config.ready_timeout:.0f}s; "
                                                  "stopping it")
            return
        for old in self._replaced(handover):
            old.role = "retiring"
            logger.info("stopping worker process %d (slot %d): replaced by %d", old.pid, old.slot, successor.pid)
            self._terminate(old)
        successor.role = "active"
        self._slots[handover.slot].start_at = None
        self._handover = None
        if handover.why == RELOAD and not any(h.why == RELOAD for h in self._handovers):
            logger.info("reload done: every worker process was replaced")

    def _begin_next_handover(self) -> None:
        if any(c.role != "active" for c in self._children.values()):
            return  # an old child still finishing its jobs: N + 1 processes already
        now = time.monotonic()
        for handover in list(self._handovers):
            if handover.why == RECYCLE:
                old = self._children.get(handover.predecessor or -1)
                if old is None or old.role != "active":
                    if old is None:  # gone (or replaced by a reload): nothing left to hand over
                        self._handovers.remove(handover)
                    continue  # a successor that asked before it took over: its turn comes once it serves
            elif self._slots[handover.slot].retired:
                self._handovers.remove(handover)
                continue
            if handover.not_before > now:
                continue
            self._handovers.remove(handover)
            why = (", replacing the old one on reload" if handover.why == RELOAD else
                   f", to take over from {handover.predecessor}, which reached its limit")
            try:
                handover.successor = self._spawn(handover.slot, "successor", why)
            except OSError as exc:
                self._handover = handover
                self._successor_failed(None, f"could not be started: {exc}")
                return
            self._handover = handover
            return

    def _successor_failed(self, successor: _Child | None, what: str) -> None:
        """The handover under way has no successor after all: the old child keeps its slot.

        A reload is given up (the old code keeps running; an operator sends
        SIGHUP again once it is fixed). A recycle is tried again later, backing
        off, since the child that asked still wants replacing.
        """
        handover = self._handover
        self._handover = None
        if handover is None:
            return
        who = f"worker process {successor.pid}" if successor is not None else "a worker process"
        if handover.why == RELOAD:
            logger.error("%s, started by the reload for slot %d, %s; the reload is given up and the old "
                         "processes keep running", who, handover.slot, what)
            self._handovers = [h for h in self._handovers if h.why != RELOAD]
            return
        handover.successor = None
        handover.failures += 1
        delay = restart_delay(handover.failures + 1, first=self.config.restart_delay,
                              cap=self.config.max_restart_delay)
        handover.not_before = time.monotonic() + delay
        self._handovers.insert(0, handover)
        logger.error("%s, started to take over from worker process %s (slot %d), %s; %s keeps running, and "
                     "another successor is tried in %.0fs", who, handover.predecessor, handover.slot, what,
                     handover.predecessor, delay)

    # --- stopping ---------------------------------------------------------------------------------------

    def _terminate(self, child: _Child) -> None:
        child.kill_at = time.monotonic() + self.config.shutdown_timeout + KILL_GRACE
        _signal(child, signal.SIGTERM)

    def _stop_all(self) -> None:
        """SIGTERM to every child, SIGKILL to those still there after the shutdown timeout; all reaped."""
        logger.info("supervisor %d: stopping %d worker process(es) (up to %.0fs for running jobs)", os.getpid(),
                    len(self._children), self.config.shutdown_timeout)
        self._handovers.clear()
        self._handover = None
        for child in self._children.values():
            if child.kill_at is None:
                self._terminate(child)
        seen_signals = self._stop_signals
        while self._children:
            self._wait(0.2)
            self._reap()
            self._kill_overdue(hurry=self._stop_signals > seen_signals)  # asked twice: no more waiting

    def _kill_overdue(self, *, hurry: bool = False) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.kill_at is None or child.kill_at == KILLED:
                continue
            if hurry or now >= child.kill_at:
                logger.warning("worker process %d did not stop in time; killing it", child.pid)
                _signal(child, signal.SIGKILL)
                child.kill_at = KILLED


def _signal(child: _Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile; the loop reaps it
        child.process.send_signal(sig)
