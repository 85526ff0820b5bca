"""A worker process's side of its supervisor (``runworker --processes N``, chasqui_core/supervisor.py).

What passes between them, and only this: the environment a child is started with (the supervisor's pid and a
pipe), the two messages a child writes on that pipe (ready; a successor, please), and the exit codes that say
why a child stopped. A child also stops by itself when its supervisor dies (the kernel's parent-death signal on
Linux, a watching thread elsewhere). Kept apart from the supervisor, which a worker process never runs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger("chasqui.supervisor")

RECYCLE_EXIT_CODE = 75
"""A child's exit code after stopping itself at its job or memory limit (EX_TEMPFAIL: "try again")."""
STOPPED_EXIT_CODE = 76
"""A child's exit code after an operator stopped it (engine/ops/control.py): its slot is retired, not refilled."""
SUPERVISOR_PID_ENV = "CHASQUI_SUPERVISOR_PID"
READY_FD_ENV = "CHASQUI_READY_FD"
READY = b"1"
"""What a child writes on its pipe once it reads its queues."""
SUCCESSOR = b"R"
"""What a child writes on its pipe, once, when it has reached a limit and wants a successor before it stops."""
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class SupervisedChild:
    """What a worker process started by a supervisor knows of it, from its environment."""

    supervisor_pid: int
    ready_fd: int | None
    asked: bool = field(default=False, init=False, compare=False)
    """A successor was asked for: a process asks once."""

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
        """Tell the supervisor this process reads its queues: a successor it started may now replace another."""
        self._send(READY)

    def ask_successor(self, reason: str) -> bool:
        """Ask the supervisor, once, to start a process in this one's place and stop this one when it reads.

        False when it cannot be told (no pipe, the supervisor gone, asked
        already): the caller then stops by itself, and its exit code says why.
        """
        if self.asked:
            return False
        self.asked = True
        return self._send(SUCCESSOR)

    def _send(self, message: bytes) -> bool:
        """The pipe stays open for the process's life; grandchildren (a task's subprocesses) do not inherit it."""
        if self.ready_fd is None:
            return False
        try:
            os.set_inheritable(self.ready_fd, False)
            return os.write(self.ready_fd, message) == len(message)
        except OSError:  # the supervisor is gone; the watcher stops this process
            return False
