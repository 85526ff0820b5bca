"""The supervisor's tests' helpers: a ``runworker`` started as operators do, and what its processes did.

``Supervised`` runs ``manage.py runworker supervised <args>`` on the test
server with ``tests.supervisor.settings`` and follows its children through
their heartbeats; ``runs`` reads what the ``nap`` task recorded in Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from chasqui_core.engine.ops import stats
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.supervised_child import SUPERVISOR_PID_ENV
from tests.supervisor.app import NAP, QUEUE

ROOT = Path(__file__).resolve().parents[2]
KEYS = QueueKeys.for_queue(QUEUE)
WAIT = 120.0
"""Seconds any one step may take: Django start-up of a child on a machine other test runs keep busy."""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.add(int(entry))
    return found


class Supervised:
    """``manage.py runworker supervised <args>``, output in a file; every process it left is killed at the end."""

    def __init__(self, tmp_path: Path, redis_url: str, *args: str, env: dict[str, str] | None = None) -> None:
        earlier = len(list(tmp_path.glob("runworker*.log")))  # a second supervisor of a test logs beside the first
        self.log_path = tmp_path / (f"runworker-{earlier + 1}.log" if earlier else "runworker.log")
        env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "tests.supervisor.settings",
               "PYTHONPATH": str(ROOT), **(env or {})}
        env.pop(SUPERVISOR_PID_ENV, None)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runworker", QUEUE, "--poll-interval", "0.05", *args],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.seen_children: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self, redis) -> set[int]:
        """Pids of the live workers whose heartbeat names this supervisor."""
        pids = {w.pid for w in stats.workers(redis, QUEUE) if w.supervisor_pid == self.pid and alive(w.pid)}
        self.seen_children |= pids
        return pids

    def wait(self, what: str, predicate, timeout: float = WAIT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout:.0f} s. runworker's output:\n{self.log()}")

    def wait_workers(self, redis, count: int, *, not_among: set[int] = frozenset()) -> set[int]:
        def ready():
            pids = self.worker_pids(redis)
            return pids if len(pids) == count and not pids & not_among else None

        return self.wait(f"{count} worker processes under supervisor {self.pid}", ready)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the supervisor did not exit after {sig!r}; its output:\n{self.log()}") from None

    def kill_everything(self) -> None:
        self.seen_children |= children_of(self.pid) if self.proc.poll() is None else set()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.seen_children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def runs(redis, key: str) -> list[tuple[str, int]]:
    """(job key, pid) of every run recorded in ``key``."""
    out = []
    for raw in redis.lrange(key, 0, -1):
        job, pid = raw.decode().rsplit(":", 1)
        out.append((job, int(pid)))
    return out


def nap(redis, key: str, seconds: float) -> None:
    Queue(QUEUE, redis_client=redis).add(NAP, [key, seconds])
