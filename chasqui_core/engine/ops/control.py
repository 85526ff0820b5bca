"""Operators' commands to one worker process: quiet (stop taking jobs) and stop (shut down gracefully).

A command is a small string key per worker, ``chasqui:control:<worker id>``,
holding ``quiet`` or ``stop``. The worker reads it with one GET every
``CONTROL_INTERVAL`` seconds from its housekeeping loop (cheap, and within
the operator's "about a second"), and deletes it when it leaves. The key
expires on its own (``COMMAND_TTL_S``) so a command sent to a worker that
was already gone does not linger. It lives outside any queue's hash tag
because a worker serves several queues; it is never touched by a script.

- ``quiet``: the worker's readers stop fetching (as a paused queue's do), the
  jobs it fetched but has not started go back on the stream as they were
  (uncharged, the same requeue as a shutdown's), and the runs under way
  finish and are settled as usual. The worker keeps beating, leasing and
  reclaiming; it can then be stopped, or restarted to take jobs again.
- ``stop``: what SIGTERM does (worker.py's shutdown). A stop replaces a
  quiet; a quiet never replaces a stop.

The worker's state (``running``, ``quiet``, ``stopping``) travels in its
heartbeat (``WorkerInfo.state``).
"""

from __future__ import annotations

from typing import Literal

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import worker_control
from chasqui_core.engine.store.scripts import Scripts

QUIET = "quiet"
STOP = "stop"
Command = Literal["quiet", "stop"]
COMMANDS: tuple[str, ...] = (QUIET, STOP)

CONTROL_INTERVAL = 1.0
"""Seconds between a worker's reads of its command key: a command takes effect within about this long."""
COMMAND_TTL_S = 3600
"""A command not picked up within an hour (its worker was gone) expires."""

RUNNING, QUIET_STATE, STOPPING = "running", "quiet", "stopping"
"""A worker's states, as its heartbeat reports them."""


def control_key(worker_id: str) -> str:
    """The key that holds the command for ``worker_id`` (keys.py)."""
    return worker_control(worker_id)


def send(scripts: Scripts, worker_id: str, command: Command) -> bool:
    """Leave ``command`` for the worker (control_send.lua); False when it, or a stop, was sent already."""
    if command not in COMMANDS:
        raise ValueError(f"a worker command is one of {', '.join(COMMANDS)}, not {command!r}")
    previous = scripts.control_send(keys=[control_key(worker_id)], args=[command, COMMAND_TTL_S])
    return previous is None


def pending(client: Client, worker_id: str) -> str | None:
    """The command waiting for a worker (or picked up and still set), if any."""
    raw = client.get(control_key(worker_id))
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def read(client: Client, worker_id: str) -> str | None:
    """The worker's side: its command, if one was sent."""
    raw = await client.get(control_key(worker_id))
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def clear(client: Client, worker_id: str) -> None:
    """The worker's goodbye: a command it acted on must not greet a process that reuses its name."""
    await client.delete(control_key(worker_id))
