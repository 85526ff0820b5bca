"""The start journal: which of a worker's deliveries were running when it died.

A worker reads ahead of what it runs (its prefetch), so when it dies its
consumer's pending list holds jobs it had fetched but never started beside
the ones it was running. Only a run that was under way is lost and charged
to its job; the others go back as they were. Redis cannot tell them apart,
so a worker writes, *before* each handler starts, the delivery's entry id
into ``{chasqui:<queue>}:running:<worker>`` (HSET entry id -> start ms). The
reclaim pass reads that hash when it takes a dead worker's entries
(reclaim.lua), and ``settle.lua`` removes the ids it settles.

The write must reach the server even if the very job it announces kills the
process at once, and it must cost the hot path next to nothing. So it is
fire-and-forget on a connection of its own with ``CLIENT REPLY OFF``: one
``send()`` per round of jobs started together (see ``Worker._dispatch``), or
per sync job, and no reply to wait for or read. Once ``send()`` returns, the
bytes are the kernel's: a process that dies right after still delivers them.
Sent from the event loop and from the sync lane's threads, so sends take a
lock. A write that fails (Redis restarting) is dropped after one reconnect:
a journal gap can only make a crash charge nothing, never lose a job, and
its ids are swept from the hash by the lease keeper anyway.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from .connection import connect, masked
from .log_budget import LogBudget

logger = logging.getLogger("chasqui.worker")

SEND_TIMEOUT_S = 1.0
"""A server that stops reading must not block the event loop for long: the write is dropped instead."""


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class StartJournal:
    """Announces the deliveries this worker is about to run, per queue, on one connection per server."""

    def __init__(self, worker_id: str, url: str | None) -> None:
        self.worker_id = worker_id
        self._url = url
        self._server: dict[str, str | None] = {}
        """Queue -> the URL of the server holding its keys (a cluster node), or None for the worker's."""
        self._heads: dict[str, bytes] = {}
        """Queue -> the start of its HSET command: the command name and the running hash's name."""
        self._conns: dict[str | None, Any] = {}
        self._lock = threading.Lock()
        self._failures = LogBudget(logger, "start journal writes dropped (Redis unavailable)")

    def use(self, queue: str, key: str, url: str | None = None) -> None:
        """Write ``queue``'s marks to hash ``key``, on the server ``url`` names (a cluster node; None: the worker's)."""
        with self._lock:
            self._server[queue] = url
            self._heads[queue] = b"$4\r\nHSET\r\n" + _bulk(key.encode())

    def started(self, marks: dict[str, list[bytes]], started_ms: int) -> None:
        """Mark entries (queue -> entry ids) as running since ``started_ms``: one send per server, not waited for."""
        stamp = _bulk(str(started_ms).encode())
        sends: dict[str | None, list[bytes]] = {}
        for queue, entry_ids in marks.items():
            sends.setdefault(self._server.get(queue), []).append(b"".join((
                b"*%d\r\n" % (2 + 2 * len(entry_ids)), self._heads[queue],
                *[_bulk(entry_id) + stamp for entry_id in entry_ids])))
        with self._lock:
            for server, commands in sends.items():
                self._send(server, b"".join(commands))

    def _send(self, server: str | None, data: bytes) -> None:
        for attempt in (1, 2):
            try:
                conn = self._conns.get(server) or self._open(server)
                conn.send_packed_command([data], check_health=False)
                return
            except Exception as exc:  # a dead or restarted server: reconnect once, then drop
                self._drop(server)
                if attempt == 2 and self._failures.allow():
                    logger.warning("start journal on %s: %s: %s; marks dropped (a crash now would charge those "
                                   "jobs nothing)", masked(server or self._url or ""), type(exc).__name__, exc)

    def connect(self) -> None:
        """Open the connections now rather than on the first job (best effort: a failure waits for that job)."""
        with self._lock:
            for server in set(self._server.values()):
                if server not in self._conns:
                    with contextlib.suppress(Exception):
                        self._open(server)

    def summarise_logs(self) -> None:
        self._failures.summarise()

    def close(self) -> None:
        with self._lock:
            for server in list(self._conns):
                self._drop(server)

    def _open(self, server: str | None) -> Any:
        client = connect(server or self._url, cluster=False, socket_timeout=SEND_TIMEOUT_S,
                         socket_connect_timeout=SEND_TIMEOUT_S)
        conn = client.connection_pool.get_connection()
        conn.send_command("CLIENT", "REPLY", "OFF")
        self._conns[server] = conn
        return conn

    def _drop(self, server: str | None) -> None:
        conn = self._conns.pop(server, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()
