"""The start journal: which of a worker's deliveries were running when it died.

A worker reads ahead of what it runs (its prefetch), so when it dies its
consumer's pending list holds jobs it had fetched but never started beside
the ones it was running. Only a run that was under way is lost and charged
to its job; the others go back as they were. Redis cannot tell them apart,
so a worker writes the entry ids of the runs under way into
``{chasqui:<queue>}:running:<worker>`` (HSET entry id -> start ms; a
priority band's stream has its own, ``running-high:<worker>``). The
reclaim pass reads that hash when it takes a dead worker's entries
(reclaim.lua). A mark is struck the moment its handler returns, before its
outcome goes anywhere (``finished_one``: by the sync lane's thread itself,
or by the loop for an async run), so a process killed between a run's end
and its settle leaves the job uncharged: it runs again (at least once), and
is never blamed for a death it did not cause. ``settle.lua`` removes the ids
it settles too.

When: a sync job's thread writes its mark just before the handler starts,
so a job that kills the process at once is charged; async jobs are written
once per round of starts, right after they started, and only those that did
not finish at once (``Runner._dispatch`` says why after rather than before).
Just before such a round, the ids about to start are written to a set of
their own (``dispatching:<worker>``, deleted with the marks after the round):
a process that dies inside a round (a job killing it before its first
``await``) leaves that set, and only its entries count toward the recovery
count of a poison pill (reclaim.lua, ``recovered``). The jobs it only had
fetched are not in it, so crash after crash never makes them a ``panic``.

The write must reach the server even if the process dies right after, and
cost the hot path next to nothing. So it is fire-and-forget on a connection
of its own with ``CLIENT REPLY OFF``: one ``send()``, and no reply to wait
for or read. Once ``send()`` returns, the bytes are the kernel's: a process
that dies right after still delivers them. A write that fails (Redis
restarting) is dropped after one reconnect, and never loses a job: a
dropped start mark makes a crash charge nothing (the recovery count still
catches a poison pill); a dropped strike leaves a finished run marked until
its outcome's settle strikes it too, so a crash while Redis is away can
still charge it. Only a journal kept outside Redis (read by the supervisor
when a child dies) would close that window.

The sync lane's threads write one mark per run, with the socket's own
``send`` on the journal's connection, made non-blocking so that a send never
waits (a full buffer, a server that went away: the send fails instead). A
send that does not go out whole closes that connection; the next mark
reconnects. The kernel does not interleave two sends on a stream socket
that each go out whole without waiting, so threads need no lock between
them. ``send`` releases the GIL around the system call: when the lane woke
a thread per job, ten threads took the GIL from each other on every job
(a noop sync job's CPU went from 13 to 28 µs), and the marks went out with
libc's ``send`` through ctypes, which keeps it. Since the lane wakes few
threads (sync_lane.py), a noop job's thread has no other lane thread
waiting for the GIL, and Python's ``send`` costs less than the ctypes call
did (turns on the bench host, docs/benchmarks.md). The commands are packed
by hiredis's ``pack_command`` (the C packer redis-py itself uses with
hiredis): about half a microsecond a command, where redis-py's own encoder
costs several times that.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any, cast

import hiredis

from chasqui_core.engine.recovery.ended_runs import EndedRuns
from chasqui_core.engine.store.connection import connect, masked
from chasqui_core.engine.worker.log_budget import LogBudget

logger = logging.getLogger("chasqui.worker")

DISPATCH_TTL_MS = 24 * 3600 * 1000
"""A round's set outlives its deletion only when the process died in the round; it waits at most this long for the
reclaim (which takes it back as soon as the dead worker's alive key lapses, unless no worker is left to run one)."""

UNSTRUCK_KEPT = 10_000
"""At most this many unsent strikes are kept per server (a long outage: the settles strike the rest)."""

SEND_TIMEOUT_S = 1.0
"""A server that stops reading must not block the event loop for long: the write is dropped instead."""

pack_command = cast(Callable[[tuple[bytes | int, ...]], bytes], hiredis.pack_command)
"""One command in RESP, packed in C (hiredis's stub types its argument as a tuple of one item)."""


class StartJournal:
    """Announces the deliveries this worker is running, per stream, on one connection per server."""

    def __init__(self, worker_id: str, url: str | None, ended: EndedRuns | None = None) -> None:
        self.worker_id = worker_id
        self._url = url
        self._ended = ended
        """The ends kept on this host too, for whoever records this process's death (ended_runs.py)."""
        self._ended_index: dict[str, int] = {}
        self._server: dict[str, str | None] = {}
        """Stream (a queue's, or a band's) -> the URL of the server holding its keys (a cluster node), or None for
        the worker's."""
        self._routes: dict[str, tuple[str | None, bytes]] = {}
        """Stream -> (its server, its running hash's name): what a sync lane thread's per-run mark needs, in one
        look-up."""
        self._rounds: dict[str, bytes] = {}
        """Stream -> the name of its set of ids about to start (``dispatching``)."""
        self._conns: dict[str | None, Any] = {}
        self._socks: dict[str | None, Any] = {}
        """The connections' sockets, written to directly (redis-py's send costs more than the send)."""
        self._fast: dict[str | None, Callable[[bytes, int], int]] = {}
        """The ``send`` of each plain (not TLS) connection, non-blocking: what a mark goes out with."""
        self._lock = threading.Lock()
        """Taken on the slow path only (a connection to open, a TLS socket), never by a mark sent whole."""
        self._failures = LogBudget(logger, "start journal writes dropped (Redis unavailable)")
        self._unstruck: dict[str | None, list[bytes]] = {}
        """Strikes that could not be sent, by server: sent first once it answers again (``_send``)."""

    def use(self, stream: str, key: str, url: str | None = None, *, dispatching: str) -> None:
        """Write the marks of ``stream``'s entries to hash ``key`` and its rounds' ids to set ``dispatching``, on
        the server ``url`` names (a cluster node; None: the worker's)."""
        self._server[stream] = url
        self._rounds[stream] = dispatching.encode()
        if self._ended is not None:
            self._ended_index[stream] = self._ended.name(key)
        self._routes[stream] = (url, key.encode())

    def use_like(self, stream: str, key: str, like: str, *, dispatching: str) -> None:
        """Write ``stream``'s marks to ``key`` and ``dispatching``, on the server ``like``'s go to (a priority
        band's stream, on its queue's node)."""
        self.use(stream, key, self._server.get(like), dispatching=dispatching)

    def dispatching(self, rounds: dict[str, list[bytes]]) -> None:
        """Name the entries (stream -> ids) about to start in one round of the event loop, before the first
        starts: one send per server, not waited for. ``started`` deletes the sets again after the round."""
        sends: dict[str | None, list[bytes]] = {}
        for stream, entry_ids in rounds.items():
            name = self._rounds[stream]
            sends.setdefault(self._server.get(stream), []).append(
                pack_command((b"SADD", name, *entry_ids)) + pack_command((b"PEXPIRE", name, DISPATCH_TTL_MS)))
        for server, commands in sends.items():
            self._write(server, b"".join(commands))

    def started_one(self, stream: str, entry_id: bytes, started_ms: int) -> None:
        """Mark one entry as running: a sync lane thread calls this just before the handler starts."""
        server, key = self._routes[stream]
        self._write(server, pack_command((b"HSET", key, entry_id, started_ms)))

    def noted_end(self, stream: str, entry_id: bytes) -> None:
        """Note one run's end on the host only (ended_runs.py: a slot write, no system call), for a wrapper that
        sees the end before the runner does (``Delivery.note_end``): the runner's strike follows, sent with its next
        start, and a death recorded meanwhile strikes the mark from this note."""
        if self._ended is not None:
            self._ended.ended(self._ended_index[stream], entry_id)

    def finished_one(self, stream: str, entry_id: bytes, noted: bool = False) -> None:
        """Strike one run's mark the moment its handler returned (a sync lane thread, or the loop for an async run
        that waited): a process killed a moment later must not be charged a run that had ended. ``noted``: its end
        is on the host already (``noted_end``)."""
        if self._ended is not None and not noted:
            self._ended.ended(self._ended_index[stream], entry_id)
        server, key = self._routes[stream]
        end = pack_command((b"HDEL", key, entry_id))
        self._write(server, end, end)

    def ended_and_started(self, ended_stream: str, ended_id: bytes, stream: str, entry_id: bytes,
                          started_ms: int, noted: bool = False) -> None:
        """Strike one run's mark and write the next run's, in one send when both go to one server (a sync lane
        thread going from one job straight to the next, once per job: hence the send inlined). ``noted``: the
        ended run is on the host already (``noted_end``)."""
        if self._ended is not None and not noted:
            self._ended.ended(self._ended_index[ended_stream], ended_id)
        server, ended_key = self._routes[ended_stream]
        next_server, key = self._routes[stream]
        if next_server != server:
            self.finished_one(ended_stream, ended_id, noted=True)
            self.started_one(stream, entry_id, started_ms)
            return
        strike = pack_command((b"HDEL", ended_key, ended_id))
        data = strike + pack_command((b"HSET", key, entry_id, started_ms))
        send = self._fast.get(server)
        if send is not None:
            try:
                if send(data, _FLAGS) == len(data):
                    return
            except OSError:
                pass
        self._write(server, data, strike, tried=send)

    def started(self, marks: dict[str, list[bytes]] | None, started_ms: int, rounds: dict[str, list[bytes]]) -> None:
        """After a round of starts: mark the entries still running (stream -> entry ids) as running since
        ``started_ms``, and delete the round's sets (``rounds``, as given to ``dispatching``): one send per server,
        not waited for."""
        sends: dict[str | None, list[bytes]] = {}
        if marks:
            for stream, entry_ids in marks.items():
                server, key = self._routes[stream]
                fields: list[bytes | int] = []
                for entry_id in entry_ids:
                    fields += (entry_id, started_ms)
                sends.setdefault(server, []).append(pack_command((b"HSET", key, *fields)))
        for stream in rounds:
            sends.setdefault(self._server.get(stream), []).append(pack_command((b"DEL", self._rounds[stream])))
        for server, commands in sends.items():
            self._write(server, b"".join(commands))

    def _write(self, server: str | None, data: bytes, strike: bytes = b"",
               tried: Callable[[bytes, int], int] | None = None) -> None:
        """Whole commands: in one non-blocking send when the connection is plain, else under the lock.
        ``strike``: the HDEL that leads ``data``, kept if it cannot be sent; ``tried``: the send a caller tried
        already, which did not send ``data`` whole (it is not tried again)."""
        send = tried
        if send is None:
            send = self._fast.get(server)
            if send is not None:
                try:
                    if send(data, _FLAGS) == len(data):
                        return
                except OSError:
                    pass
        if send is not None:
            with self._lock:  # not sent whole: this connection cannot be trusted with the next command
                if self._fast.get(server) is send:
                    self._drop(server)
        with self._lock:
            self._send(server, data, strike)

    def _send(self, server: str | None, data: bytes, strike: bytes = b"") -> None:
        """Send on the slow path, under the lock: a whole command, reconnecting once.

        A strike (``strike``: the HDEL part of ``data``) that cannot be sent is kept and sent first once the
        server answers again: a run that ended while Redis restarted must not stay marked running, or a crash
        after the restart would charge it a death. A start mark is not kept: sent late, it would mark a run
        that may have ended since."""
        sock = self._socks.get(server)
        if sock is not None:
            try:
                unstruck = self._unstruck.get(server)
                sock.sendall(b"".join(unstruck) + data if unstruck else data)
                self._unstruck.pop(server, None)
                return
            except Exception:  # a dead connection (Redis restarted): reconnect once, then drop
                pass
        for attempt in (1, 2):
            try:
                sock = self._open(server)
                unstruck = self._unstruck.get(server)
                sock.sendall(b"".join(unstruck) + data if unstruck else data)
                self._unstruck.pop(server, None)
                if not isinstance(sock, ssl.SSLSocket):
                    self._fast[server] = _nonblocking_send(sock)  # only now: no mark may interleave with this one
                return
            except Exception as exc:
                self._drop(server)
                if attempt == 2:
                    if strike and len(self._unstruck.get(server, ())) < UNSTRUCK_KEPT:
                        self._unstruck.setdefault(server, []).append(strike)
                    if self._failures.allow():
                        logger.warning("start journal on %s: %s: %s; start marks dropped (a crash now would charge "
                                       "those jobs nothing), ends kept until it answers", masked(server or self._url
                                       or ""), type(exc).__name__, exc)

    def connect(self) -> None:
        """Open the connections now rather than on the first job (best effort: a failure waits for that job)."""
        with self._lock:
            for server in set(self._server.values()):
                if server not in self._conns:
                    with contextlib.suppress(Exception):
                        sock = self._open(server)
                        if not isinstance(sock, ssl.SSLSocket):
                            self._fast[server] = _nonblocking_send(sock)

    def summarise_logs(self) -> None:
        self._failures.summarise()

    def close(self, *, keep_ends: bool = False) -> None:
        """Close the connections; ``keep_ends``: leave the ends noted on the host for whoever records this
        process's death (ended_runs.EndedRuns.close)."""
        with self._lock:
            for server in list(self._conns):
                self._drop(server)
        if self._ended is not None:
            self._ended.close(keep=keep_ends)

    def _open(self, server: str | None) -> Any:
        """A connection to ``server``, opened now; returns its socket."""
        self._drop(server)
        client = connect(server or self._url, cluster=False, socket_timeout=SEND_TIMEOUT_S,
                         socket_connect_timeout=SEND_TIMEOUT_S)
        conn = client.connection_pool.get_connection()
        conn.send_command("CLIENT", "REPLY", "OFF")
        conn.chasqui_client = client  # the client must live as long as its connection: it closes it when collected
        self._conns[server] = conn
        self._socks[server] = conn._sock
        return conn._sock

    def _drop(self, server: str | None) -> None:
        self._fast.pop(server, None)
        self._socks.pop(server, None)
        conn = self._conns.pop(server, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()


def _nonblocking_send(sock: socket.socket) -> Callable[[bytes, int], int]:
    """``sock``'s ``send``, made never to wait (the journal's own connection: nothing else writes to it)."""
    sock.setblocking(False)
    return sock.send


_FLAGS = getattr(socket, "MSG_DONTWAIT", 0) | getattr(socket, "MSG_NOSIGNAL", 0)
