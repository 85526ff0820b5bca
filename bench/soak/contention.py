"""CPU contention: busy processes beside the soak, so its windows open as wide as on a loaded host.

A race between a run's end and its settle, or between a lease and its
renewal, is microseconds wide on an idle machine and tens of milliseconds on
one whose cores are all taken. Each busy process spins the interpreter on
one core; the operating system shares the cores between them and the soak's
workers, as it does on a busy production host.

Every busy process stops by itself after ``lifetime`` seconds (a bound on
the whole soak), so none outlives a soak that was killed; ``stop`` ends them
at once otherwise.
"""

from __future__ import annotations

import subprocess
import sys

BUSY = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    for _ in range(100_000):
        n += 1
"""
"""Spins until its lifetime is over, looking at the clock every hundred thousand additions."""


class Contention:
    """N busy processes, started together and stopped together."""

    def __init__(self, processes: int, lifetime: float) -> None:
        if processes < 0:
            raise ValueError(f"the number of busy processes cannot be negative, got {processes}")
        self.processes = processes
        self.lifetime = lifetime
        self.procs: list[subprocess.Popen] = []

    def start(self) -> list[int]:
        for _ in range(self.processes):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY, str(self.lifetime)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                )
            )
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        """Kill every busy process still running and reap them all."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()

    def __enter__(self) -> Contention:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
