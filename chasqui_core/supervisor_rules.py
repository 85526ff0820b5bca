"""The supervisor's settings and rules (``runworker --processes N``, chasqui_core/supervisor.py): its
configuration, the command line a child runs, how long a slot waits before restarting a child that keeps dying,
and what an exit code says. Plain functions the supervisor's loop applies, and runworker and the tests call too.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass


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
    """How long a successor may take to be ready before it is given up (and with it a reload)."""
    on_child_exit: Callable[[int, int], None] | None = None
    """Called with an ended child's pid and exit code, before anything else is done about it: runworker records
    the death of the child's worker in Redis there, so the runs it had under way are charged as deaths, not as
    lost contact (engine/recovery/reclaim.py). Its errors are logged, never raised."""

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
    does not burn a core restarting. Only deaths before a child was ready
    count: one that read its queues and then died (a job that killed it) is
    replaced at once, or a poison pill's few deaths would leave its slot empty
    for as long as the backoff, and with every slot so, the queues unread.
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
