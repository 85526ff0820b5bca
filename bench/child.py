"""Benchmark processes: the programs that run workers, and the handle that drives them.

Workers are measured in their own process, as they run in production, and
the latency scenario needs the producer and the worker apart. A child is
started as ``python -m bench.child <program> <json config>`` and talks over
its stdin and stdout, one JSON message per line; stdout lines that are not
messages (a stray print) pass through, and stderr is the parent's.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .results import BenchError
import contextlib

ROOT = Path(__file__).resolve().parent.parent
PROFILE_HINT = "pip install --no-deps -r requirements-bench.txt"
PREFIX = b"@@bench "

PROFILE_DIR_ENV = "BENCH_PROFILE_DIR"
"""When set (``python -m bench --profile DIR``), every child is sampled by py-spy into DIR."""

PROGRAMS = {
    "drain": "bench.consumer:serve_drain",
    "latency": "bench.latency:serve",
    "rq-drain": "bench.peers:serve_rq",
    "arq-drain": "bench.peers:serve_arq",
}


# --- the parent's side ---------------------------------------------------------------


def start_profiler(pid: int, name: str) -> subprocess.Popen | None:
    """With ``--profile DIR``, sample process ``pid`` with py-spy into ``DIR/<name>-<pid>.speedscope.json``."""
    folder = os.environ.get(PROFILE_DIR_ENV)
    if not folder:
        return None
    beside = Path(sys.executable).with_name("py-spy")
    pyspy = str(beside) if beside.exists() else shutil.which("py-spy")
    if pyspy is None:
        print(f"   (no profile: py-spy is not installed; {PROFILE_HINT})", file=sys.stderr)
        return None
    os.makedirs(folder, exist_ok=True)
    out = Path(folder) / f"{name}-{pid}.speedscope.json"
    print(f"   profiling the {name} process {pid} into {out}", file=sys.stderr)
    return subprocess.Popen([pyspy, "record", "--pid", str(pid), "--rate", "250", "--format", "speedscope",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(profiler: subprocess.Popen | None) -> None:
    """Wait for py-spy to write its file, which it does once the process it samples has exited."""
    if profiler is None:
        return
    try:
        profiler.wait(30)
    except subprocess.TimeoutExpired:
        profiler.kill()
        profiler.wait()


class Child:
    """A running benchmark process. Use as a context manager: it is always stopped."""

    def __init__(self, program: str, config: dict[str, Any]) -> None:
        if program not in PROGRAMS:
            raise ValueError(f"unknown benchmark program {program!r}")
        self.program = program
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.child", program, json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env=env,
        )
        self._buf = b""
        self._profiler = start_profiler(self.pid, self.program)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> Child:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.kill()

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"the {self.program} process exited early (code {self.proc.wait()})") from None

    def receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            line, sep, rest = self._buf.partition(b"\n")
            if sep:
                self._buf = rest
                if not line.startswith(PREFIX):
                    sys.stdout.write(line.decode(errors="replace") + "\n")
                    continue
                message = json.loads(line[len(PREFIX):])
                if "error" in message:
                    raise BenchError(f"the {self.program} process failed:\n{message['error']}")
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"the {self.program} process did not answer within {timeout:.0f} s")
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    code = self.proc.wait()
                    raise BenchError(f"the {self.program} process exited (code {code}) before answering")
                self._buf += chunk

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(message)
        return self.receive(timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Ask the program to stop its worker cleanly and exit."""
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.receive(timeout)
            except BenchError:
                self.kill()
                raise
        self.proc.wait(timeout)
        self._close_pipes()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()

    def _stop_profiler(self) -> None:
        stop_profiler(self._profiler)
        self._profiler = None

    def _close_pipes(self) -> None:
        self._stop_profiler()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


# --- the child's side --------------------------------------------------------------------


class Channel:
    """The child's end: messages to the parent on stdout, commands from stdin."""

    def __init__(self) -> None:
        self._out = sys.stdout.buffer
        sys.stdout = sys.stderr  # stray prints must not mix with messages

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(PREFIX + json.dumps(message).encode() + b"\n")
        self._out.flush()

    def receive(self) -> dict[str, Any]:
        line = sys.stdin.readline()
        if not line:
            return {"cmd": "quit"}
        return json.loads(line)


def main(argv: list[str]) -> int:
    program, config = argv[1], json.loads(argv[2])
    module, _, func = PROGRAMS[program].partition(":")
    channel = Channel()
    try:
        getattr(importlib.import_module(module), func)(config, channel)
    except BaseException as exc:  # report every failure to the parent, then exit non-zero
        if isinstance(exc, KeyboardInterrupt):
            return 130
        channel.send({"error": traceback.format_exc()})
        return 1
    channel.send({"bye": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
