"""``manage.py devstack``: the whole stack for local development in one command.

Starts (1) a Valkey server unless ``REDIS_URL`` points at one, (2) Daphne
serving ``config.asgi`` and (3) a Chasqui worker, and supervises them: Ctrl+C
or SIGTERM stops everything in order (web and worker first so the worker can
finish its jobs, Valkey last), and if one process dies the others are stopped
too, so the developer never keeps half a stack running without noticing.

One exit is not a death: a worker stopped by an operator (the console's or
the API's "Stop") exits cleanly on purpose. The stack says so and keeps the
web server and Valkey running, so the console that sent the stop stays up.

This is the demo project's command (``config`` is an app of this repository
only): it is not in the package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chasqui_core.engine.store.embedded import EmbeddedValkey
from chasqui_core.supervised_child import STOPPED_EXIT_CODE

POLL_INTERVAL = 0.2
WEB_START_TIMEOUT = 60.0
"""Seconds to wait for the web server to answer before saying so (printing the console's address waits for it)."""
SAME_REQUEST_WINDOW = 1.0
"""Seconds within which a repeated stop signal is taken as the same request, not as "stop now".

``make run`` forwards a SIGTERM it receives to this command, and process
managers signal every process of a group at once, so one request to stop can
arrive twice within milliseconds; only a deliberate second Ctrl+C skips the
graceful wait.
"""


OPERATOR_STOP_CODES = frozenset({0, STOPPED_EXIT_CODE})
"""How ``runworker`` exits when an operator stops it: 0 as a single process, 76 as a supervised one."""


@dataclass
class Child:
    """One supervised subprocess."""

    name: str
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    stoppable: bool = False
    """Whether a clean exit of its own is a stop someone asked for (a worker), not a death."""

    def start(self, env: dict[str, str], cwd: Path) -> None:
        # Each child gets its own process group: a Ctrl+C in the terminal then
        # reaches only this command, which stops the children in order instead
        # of all processes receiving SIGINT at once.
        self.process = subprocess.Popen(
            self.args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, process_group=0
        )

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def describe_exit(self) -> str:
        code = self.returncode
        if code is not None and code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _browsable(host: str) -> str:
    """The address a browser on this machine opens for a server bound to ``host`` (any interface: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def start_ignoring_ctrl_c(server: EmbeddedValkey) -> str:
    """Start the server so that a terminal Ctrl+C does not reach it.

    Ctrl+C sends SIGINT to the whole foreground process group, and Valkey
    shuts down on SIGINT. It must instead outlive the worker, which still
    acknowledges its last jobs while stopping; we stop it last, with SIGTERM.
    A blocked signal mask survives exec, so a server started while SIGINT is
    blocked here never receives it.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return server.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Command(BaseCommand):
    help = (
        "Run the development stack: embedded Valkey (unless REDIS_URL is set), "
        "the Daphne ASGI server and a Chasqui worker. Ctrl+C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Interface Daphne binds to.")
        parser.add_argument("--port", type=int, default=8000, help="Port Daphne listens on.")
        parser.add_argument(
            "--queues",
            default="emails",
            help="Comma-separated queues the worker consumes (default: emails).",
        )
        parser.add_argument(
            "--redis-port",
            type=int,
            default=None,
            help="Port of the embedded Valkey server (default: a free port). "
            "Ignored when REDIS_URL is set.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=15.0,
            help="Seconds to wait for the children to exit before killing them.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
        if not queues:
            raise CommandError("--queues needs at least one queue name.")
        self._stop_signal: int | None = None
        self._stop_requested_at = 0.0
        self._force = False
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        server: EmbeddedValkey | None = None
        children: list[Child] = []
        try:
            redis_url = os.environ.get("REDIS_URL", "").strip()
            if redis_url:
                self.stdout.write(f"Using Redis at {redis_url} (from REDIS_URL).")
            else:
                server = EmbeddedValkey(
                    settings.VAR_DIR / "valkey",
                    port=options["redis_port"],
                    appendonly=True,
                )
                try:
                    redis_url = start_ignoring_ctrl_c(server)
                except RuntimeError as exc:
                    raise CommandError(str(exc)) from exc
                self.stdout.write(
                    f"Embedded Valkey running at {redis_url} (data in {server.data_dir})."
                )

            # CHASQUI_DEMO turns on the demo signup form, in this stack only.
            env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", "CHASQUI_DEMO": "1"}
            manage_py = str(settings.BASE_DIR / "manage.py")
            children = [
                Child(
                    "web server (daphne)",
                    [
                        sys.executable, "-m", "daphne",
                        "-b", options["host"], "-p", str(options["port"]),
                        "config.asgi:application",
                    ],
                ),
                Child(f"worker ({', '.join(queues)})", [sys.executable, manage_py, "runworker", *queues],
                      stoppable=True),
            ]
            for child in children:
                if self._stop_signal is None:
                    child.start(env, settings.BASE_DIR)
            failed = self._wait_for_web(children[0], options["host"], options["port"])
            if failed is None:
                if self._stop_signal is None:
                    self.stdout.write(
                        self.style.SUCCESS(
                            f"Chasqui's console is at http://{_browsable(options['host'])}:{options['port']}/ "
                            f"(a worker runs for {', '.join(queues)}). Press Ctrl+C to stop."
                        )
                    )
                failed = self._supervise(children)
            self._stop_children(children, options["shutdown_timeout"])
            if failed is not None:
                raise CommandError(
                    f"The {failed.name} {failed.describe_exit()} unexpectedly; "
                    "stopped the rest of the stack. See its output above."
                )
            self.stdout.write("Stopped.")
        finally:
            # Also reached on errors: never leave children or Valkey behind.
            self._stop_children(children, options["shutdown_timeout"])
            if server is not None:
                server.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only set flags here: writing to stdout from a signal handler can
        # interrupt a write in progress on the same stream.
        if self._stop_signal is None:
            self._stop_signal = signum
            self._stop_requested_at = time.monotonic()
        elif time.monotonic() - self._stop_requested_at >= SAME_REQUEST_WINDOW:
            # A second Ctrl+C means "now": skip the graceful wait.
            self._force = True

    def _wait_for_web(self, web: Child, host: str, port: int) -> Child | None:
        """Wait until the web server accepts connections, so the address printed next answers at once.

        Returns the web server if it died first, None once it answers (or a stop
        signal came). A server still silent after ``WEB_START_TIMEOUT`` is
        reported, and waited for no longer: it may be busy, not broken.
        """
        deadline = time.monotonic() + WEB_START_TIMEOUT
        while self._stop_signal is None:
            if not web.running:
                return web
            try:
                socket.create_connection((_browsable(host), port), timeout=POLL_INTERVAL).close()
                return None
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stderr.write(f"The web server has not answered on port {port} after {WEB_START_TIMEOUT:g}s; "
                                  "still waiting for it.")
                return None
            time.sleep(POLL_INTERVAL)
        return None

    def _supervise(self, children: list[Child]) -> Child | None:
        """Wait for a stop signal (return None) or a child's death (return it).

        A worker that exits as an operator's stop makes it exit (see the
        module's docstring) is said so and let go; the rest keeps running.
        """
        watched = list(children)
        while self._stop_signal is None:
            for child in list(watched):
                if child.running:
                    continue
                if child.stoppable and child.returncode in OPERATOR_STOP_CODES:
                    watched.remove(child)
                    self.stdout.write(self.style.WARNING(
                        f"The {child.name} stopped on request (an operator's stop, from the console or the API). "
                        "The console and Redis keep running; start a worker again with "
                        f"`python manage.py {' '.join(child.args[2:])}` in another terminal, or press Ctrl+C to "
                        "stop the rest and `make run` again."))
                    continue
                return child
            time.sleep(POLL_INTERVAL)
        self.stdout.write(f"\n{signal.Signals(self._stop_signal).name} received, stopping...")
        return None

    def _stop_children(self, children: list[Child], timeout: float) -> None:
        """SIGTERM the running children, wait up to ``timeout``, then SIGKILL."""
        alive = [c for c in children if c.running]
        for child in alive:
            assert child.process is not None
            child.process.terminate()
        deadline = time.monotonic() + timeout
        while alive and time.monotonic() < deadline and not self._force:
            time.sleep(POLL_INTERVAL / 2)
            alive = [c for c in alive if c.running]
        for child in alive:
            assert child.process is not None
            self.stderr.write(f"The {child.name} did not stop in time; killing it.")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)  # with its own children
            child.process.wait()
