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
(``CHASQUI_SUPERVISOR_PID``), one pipe per child (a byte when the child is
ready to take jobs), signals, and the exit code (``RECYCLE_EXIT_CODE`` means
"I stopped on purpose after my job or memory limit: replace me now").

A child notices its supervisor's death without help: Linux sends it SIGTERM
(``PR_SET_PDEATHSIG``), and a thread checks ``os.getppid()`` every second
everywhere else; either way it stops as gracefully as on a plain SIGTERM, so
no worker outlives its supervisor, even one killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

logger = logging.getLogger("chasqui.supervisor")

RECYCLE_EXIT_CODE = 75
"""A child's exit code after stopping itself at its job or memory limit (EX_TEMPFAIL: "try again")."""
STOPPED_EXIT_CODE = 76
"""A child's exit code after an operator stopped it (engine/control.py): its slot is retired, not refilled."""
SUPERVISOR_PID_ENV = "CHASQUI_SUPERVISOR_PID"
READY_FD_ENV = "CHASQUI_READY_FD"
KILL_GRACE = 5.0
"""Seconds a stopping child gets beyond its shutdown timeout (settling, closing Django) before SIGKILL."""
_PR_SET_PDEATHSIG = 1
KILLED = float("inf")
"""``_Child.kill_at`` of a child already sent SIGKILL."""


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    command: tuple[str, ...]
    """The command line of one worker process."""
    processes: int
    shutdown_timeout: float = 25.0
    """Seconds a child may spend finishing its running jobs after SIGTERM; it is killed KILL_GRACE later."""
    restart_delay: float = 1.0
    """Wait before the second restart in a row of a child that keeps dying; doubled each time."""
    max_restart_delay: float = 30.0
    stable_after: float = 30.0
    """A child up this long has proven itself: the next death of its slot restarts at once again."""
    ready_timeout: float = 120.0
    """On reload, how long a new child may take to be ready before the reload is given up."""
    on_child_exit: Callable[[int, int], None] | None = None
    """Called with an ended child's pid and exit code, before anything else is done about it: runworker records
    the death of the child's worker in Redis there, so the runs it had under way are charged as deaths, not as
    lost contact (engine/recovery.py). Its errors are logged, never raised."""

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"processes must be 1 or more, got {self.processes}")
        if not self.command:
            raise ValueError("command must name the worker program")


def restart_delay(deaths: int, *, first: float, cap: float) -> float:
    """Seconds to wait before restarting a slot whose children died ``deaths`` times in a row, quickly.

    The first death restarts at once (a crash or an OOM kill is usually a
    one-off); after that ``first``, twice that, and so on up to ``cap``, so a
    child that cannot start (a syntax error in a task module, Redis down)
    does not burn a core restarting.
    """
    if deaths <= 1:
        return 0.0
    return min(cap, first * 2 ** (deaths - 2))


def describe_exit(code: int) -> str:
    """``exited with code 1`` or ``was killed by SIGKILL``, from a Popen return code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


@dataclass(slots=True)
class _Child:
    slot: int
    process: subprocess.Popen
    ready_pipe: int
    """Read end of the pipe the child writes one byte to when it is ready; -1 once read or closed."""
    started_at: float = field(default_factory=time.monotonic)
    ready: bool = False
    role: str = "active"
    """``active`` (serving its slot), ``successor`` (started by a reload, not serving yet) or ``retiring``."""
    kill_at: float | None = None
    """When a stopping child is killed if it has not exited by then."""

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(slots=True)
class _Slot:
    deaths: int = 0
    """Quick deaths in a row (children that died before ``stable_after``)."""
    start_at: float | None = 0.0
    """When to start the slot's next child; None while a child serves it."""
    retired: bool = False
    """An operator stopped the slot's child: nothing is started in it again."""


class Supervisor:
    """Keeps ``config.processes`` copies of ``config.command`` running until SIGTERM or SIGINT."""

    def __init__(self, config: SupervisorConfig, *, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.env = dict(os.environ if env is None else env)
        self._children: dict[int, _Child] = {}
        self._slots = [_Slot() for _ in range(config.processes)]
        self._stop_signals = 0
        self._reload_requested = False
        self._reload_slots: list[int] = []
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
                self._advance_reload()
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
        """Sleep until a signal, a child's ready byte or ``timeout``; note the children that became ready."""
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
            if os.read(fd, 1):
                child.ready = True
                logger.info("worker process %d (slot %d) is ready", child.pid, child.slot)
            os.close(fd)  # a byte or end of file: either way the pipe has said all it will
            child.ready_pipe = -1

    # --- starting and replacing ------------------------------------------------------------------

    def _spawn(self, slot: int, role: str) -> _Child:
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
        logger.info("started worker process %d (slot %d%s)", child.pid, slot,
                    ", replacing the old one on reload" if role == "successor" else "")
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
                os.close(child.ready_pipe)
            self._on_exit(child, code)

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
            logger.info("worker process %d (slot %d, replaced on reload) %s", child.pid, child.slot, how)
            return
        if child.role == "successor":
            logger.error("worker process %d, started by the reload for slot %d, %s before it was ready; "
                         "the reload is given up and the old processes keep running", child.pid, child.slot, how)
            self._reload_slots.clear()
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

    # --- reload (SIGHUP) ----------------------------------------------------------------------------

    def _begin_reload(self) -> None:
        self._reload_requested = False
        if self._reload_slots:
            logger.info("reload requested while one is under way: the remaining slots are replaced anyway")
            return
        self._reload_slots = [n for n, slot in enumerate(self._slots) if not slot.retired]  # stopped stay stopped
        logger.info("reloading: replacing %d worker process(es) one at a time", len(self._reload_slots))

    def _successor_of(self, slot: int) -> _Child | None:
        return next((c for c in self._children.values() if c.slot == slot and c.role == "successor"), None)

    def _advance_reload(self) -> None:
        """One step of the reload: a new child for the next slot, and once it is ready, the old one stops.

        A slot is started only when no old child is still finishing its jobs,
        so there is never more than one process above the count.
        """
        if not self._reload_slots:
            return
        slot = self._reload_slots[0]
        successor = self._successor_of(slot)
        if successor is None:
            if any(c.role == "retiring" for c in self._children.values()):
                return
            try:
                self._spawn(slot, "successor")
            except OSError as exc:
                logger.error("reload given up: could not start a worker process: %s", exc)
                self._reload_slots.clear()
            return
        if not successor.ready:
            if time.monotonic() - successor.started_at > self.config.ready_timeout:
                logger.error("reload given up: worker process %d was not ready after %.0fs; stopping it",
                             successor.pid, self.config.ready_timeout)
                self._reload_slots.clear()
                successor.role = "retiring"
                self._terminate(successor)
            return
        for old in [c for c in self._children.values() if c.slot == slot and c.role == "active"]:
            old.role = "retiring"
            logger.info("stopping worker process %d (slot %d): replaced by %d", old.pid, slot, successor.pid)
            self._terminate(old)
        successor.role = "active"
        self._slots[slot].start_at = None
        self._reload_slots.pop(0)
        if not self._reload_slots:
            logger.info("reload done: every worker process was replaced")

    # --- stopping ---------------------------------------------------------------------------------------

    def _terminate(self, child: _Child) -> None:
        child.kill_at = time.monotonic() + self.config.shutdown_timeout + KILL_GRACE
        _signal(child, signal.SIGTERM)

    def _stop_all(self) -> None:
        """SIGTERM to every child, SIGKILL to those still there after the shutdown timeout; all reaped."""
        logger.info("supervisor %d: stopping %d worker process(es) (up to %.0fs for running jobs)", os.getpid(),
                    len(self._children), self.config.shutdown_timeout)
        self._reload_slots.clear()
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


# --- the child's side ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SupervisedChild:
    """What a worker process started by a supervisor knows of it, from its environment."""

    supervisor_pid: int
    ready_fd: int | None

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> SupervisedChild | None:
        environ = os.environ if environ is None else environ
        pid = environ.get(SUPERVISOR_PID_ENV, "")
        if not pid.isdigit():
            return None
        fd = environ.get(READY_FD_ENV, "")
        return cls(int(pid), int(fd) if fd.isdigit() else None)

    def watch_supervisor(self, on_gone: Callable[[], None], *, interval: float = 1.0) -> None:
        """Call ``on_gone`` (from a thread, repeatedly) once the supervisor has died.

        On Linux the kernel also sends this process SIGTERM when its parent
        dies; the thread is for other systems, and for the instant before the
        event loop's signal handlers exist. A SIGHUP meant for the supervisor
        (a terminal hang-up, ``kill -HUP`` of the group) is ignored here: a
        reload is the supervisor's to run, and it stops children with SIGTERM.
        """
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            except (OSError, AttributeError):
                pass

        def watch() -> None:
            while os.getppid() == self.supervisor_pid:
                time.sleep(interval)
            logger.warning("the supervisor (pid %d) is gone; stopping", self.supervisor_pid)
            while True:  # again and again: the worker may not be running yet to hear the first call
                on_gone()
                time.sleep(interval)

        threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()

    def ready(self) -> None:
        """Tell the supervisor this process has loaded its tasks and is about to take jobs."""
        if self.ready_fd is None:
            return
        try:
            os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)
        except OSError:  # the supervisor is gone; the watcher stops this process
            pass


def cpu_count() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def child_command(argv0: str, arguments: Sequence[str]) -> list[str]:
    """The command line that runs ``manage.py <arguments>`` the way this process was started.

    ``python manage.py`` (or ``django-admin``) is run again as a script;
    ``python -m django`` again as a module, since running django's own
    ``__main__.py`` as a script would put the django package first on sys.path.
    """
    if not argv0 or os.path.basename(argv0) == "__main__.py":
        return [sys.executable, "-m", "django", *arguments]
    return [sys.executable, os.path.abspath(argv0), *arguments]
