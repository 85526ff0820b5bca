"""The worker side of the soak: one ``manage.py runworker ... --processes 2`` supervisor, as an operator runs it.

The soak starts it as a subprocess on its own settings (bench/soak/settings.py),
kills it with SIGKILL and starts a fresh one, sends it SIGHUP, and kills its
children with SIGKILL. Children are found from the process table (their
parent's pid, in /proc), not from anything the supervisor says, so the soak
sees what is really running. The visibility timeout is short (5 s by
default) so that a killed child's jobs are reclaimed within the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ..child import ROOT

STOP_TIMEOUT = 60.0


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process, from /proc."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # the command name, in parentheses, may hold spaces
        out[int(name)] = (int(rest[1]), rest[0])
    return out


def alive(pid: int, table: dict[int, tuple[int, str]] | None = None) -> bool:
    table = process_table() if table is None else table
    entry = table.get(pid)
    return entry is not None and entry[1] not in ("Z", "X")


class WorkerSupervisor:
    """The ``runworker`` supervisor and its children."""

    def __init__(self, queues: list[str], *, env: dict[str, str], log_path: str, processes: int = 2,
                 concurrency: int = 8, visibility_timeout_ms: int = 5000, shutdown_timeout: float = 10.0) -> None:
        self.command = [sys.executable, "manage.py", "runworker", *queues, "--processes", str(processes),
                        "--concurrency", str(concurrency), "--visibility-timeout", str(visibility_timeout_ms),
                        "--shutdown-timeout", str(shutdown_timeout)]
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> int:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        return self.proc.pid

    def children(self, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
        if self.proc is None:
            return []
        table = process_table() if table is None else table
        return sorted(pid for pid, (ppid, state) in table.items() if ppid == self.proc.pid and state not in "ZX")

    def wait_for_children(self, n: int, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            kids = self.children()
            if len(kids) >= n or time.monotonic() > deadline:
                return kids
            time.sleep(0.2)

    def exited(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> list[int]:
        """SIGKILL the supervisor; returns the children it leaves (they notice and stop by themselves)."""
        assert self.proc is not None
        kids = self.children()
        self.proc.kill()
        self.proc.wait()
        return kids

    def stop(self) -> int | None:
        """SIGTERM, and wait; SIGKILL if it takes longer than STOP_TIMEOUT. Returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
