"""A producer's link to Redis: adds that survive a restart and never land twice.

Why producers retry. A Redis restart or a failover is a few seconds in which
every command fails; a producer in a web request should ride that out, not
hand the user redis-py's ``ConnectionError``. So a write that fails because
the server is unavailable (refused or broken connection, timeout, ``LOADING``,
``READONLY``, ``MASTERDOWN``...) is retried with backoff for ``retry_for``
seconds, then ``EnqueueUnavailable`` says which server and why.

Why retries cannot duplicate. A write whose reply was lost may or may not
have run, and XADD has no id of its own to deduplicate on (XADD IDMP is
Redis 8 only). So every write carries a *lane* and a *sequence number*,
fixed before the first try. A lane is a producer-side token that carries one
write at a time (a link below, or one async caller); ``enqueue.lua`` stores
the lane's last sequence number and reply in ``{chasqui:<q>}:lane:<id>``, in
the same atomic call as the jobs, so a re-sent write finds its own number
there and returns the first reply instead of adding the jobs again. Because a
lane is never used by two writes at once, one key per lane is enough: the
cost is one small key per producer connection, not a marker per job. The key
and the jobs share one script call, so a restart that loses one loses both.

Why a link of its own. A sequential producer waits for each reply; on a
virtual machine a sleeping ``recv`` costs more than the round trip itself, so
the link owns its connection (no pool checkout per add), sends commands packed
once, parses replies with hiredis directly, and polls the socket briefly
before it sleeps. Connections other than plain TCP or Unix sockets (TLS...)
go through redis-py's own send and read.

On a Redis Cluster a link talks to the master that serves its queue's slot
(every key of a queue shares one). A failover or a resharding moves the
slot: the write is then refused with ``MOVED``, certainly not run, or meets a
dead node. Either way the link re-reads the cluster's layout and sends the
same bytes to the slot's master now, within the same retry window. Behind
Sentinel the link's connection asks the Sentinels for the master each time it
connects, and a master turned replica answers ``READONLY``: retried the same way.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import contextlib
from redis.sentinel import SentinelManagedConnection

from chasqui_core.engine.store.connection import is_cluster_client, server_of

SPINS = 100
"""Non-blocking reads tried before the link sleeps in ``recv`` (about 1 µs each)."""

LAST_WAIT = 0.1
"""Seconds a try started at the end of its write's window may still wait (to connect, or for its reply): a
server that answers at once (``READONLY``...) is heard, and a silent one costs the window this much more."""

UNAVAILABLE_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
"""Error replies of a server that refused the command without running it, during a restart or failover."""

REDIRECT_REPLIES = ("MOVED", "ASK")
"""Error replies of a cluster node that does not serve the slot (now): the command did not run."""

_UNAVAILABLE_ERRORS = (redis.exceptions.ReadOnlyError, redis.exceptions.TryAgainError,
                       redis.exceptions.ClusterDownError, redis.exceptions.AskError)
"""The same replies as redis-py's own parser raises them (their prefix cut off the message): MasterDownError is a
ClusterDownError, MovedError an AskError. Replies read with hiredis directly arrive as plain ResponseErrors."""

_RAW_CONNECTIONS = (redis.Connection, redis.UnixDomainSocketConnection, SentinelManagedConnection)


def unavailable(exc: BaseException) -> bool:
    """True for the errors of a server that is restarting, failing over or unreachable."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError, *_UNAVAILABLE_ERRORS)):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(UNAVAILABLE_REPLIES + REDIRECT_REPLIES)


def moved(exc: BaseException) -> redis.exceptions.MovedError | None:
    """A cluster node's ``MOVED <slot> <host>:<port>`` (the slot has another master now) as redis-py's MovedError."""
    if isinstance(exc, redis.exceptions.MovedError):
        return exc
    if isinstance(exc, redis.ResponseError) and str(exc).startswith("MOVED "):
        return redis.exceptions.MovedError(str(exc).split(" ", 1)[1])
    return None


def not_run(exc: BaseException) -> bool:
    """True when the failed command certainly did not run (refused, or never reached the server)."""
    return isinstance(exc, (redis.ResponseError, redis.BusyLoadingError)) or "connecting to" in str(exc)


def backoff_delays(first: float = 0.05, cap: float = 1.0) -> Iterator[float]:
    """Pauses between retries: 50 ms doubling to 1 s, each ±20 % so producers do not retry in step."""
    delay = first
    while True:
        yield delay * random.uniform(0.8, 1.2)
        delay = min(delay * 2, cap)


class Retrier:
    """The retry window of one write: how long is left, how long to pause, what went wrong.

    The window closes ``retry_for`` seconds after the write began (``deadline``, when the caller knows it), not
    after its first failure: a try that waited out a silent server has used its share of the window.
    """

    def __init__(self, retry_for: float, deadline: float | None = None) -> None:
        self.retry_for = retry_for
        self.deadline = time.monotonic() + retry_for if deadline is None else deadline
        self.tries = 0
        self.maybe_run = False
        self._delays = backoff_delays()

    def pause(self, exc: BaseException, *, sent: bool) -> float | None:
        """Record a failed try; the seconds to wait before the next, or None when the window is spent."""
        self.tries += 1
        self.maybe_run = self.maybe_run or (sent and not not_run(exc))
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        return float(min(next(self._delays), left))


def _poll_ms(wait: float | None) -> int | None:
    """A wait in seconds as ``poll`` takes it: whole milliseconds, rounded up; None waits for good."""
    return None if wait is None else max(0, math.ceil(wait * 1000))


_process = [os.getpid()]
"""This process's id, kept here: ``os.getpid()`` is a system call, and every add asks whether its link was made
before a fork."""
os.register_at_fork(after_in_child=lambda: _process.__setitem__(0, os.getpid()))


def process_id() -> int:
    """This process's id, without a system call."""
    return _process[0]


class Lane:
    """A producer-side token that carries one write at a time, numbered in order."""

    def __init__(self) -> None:
        self.lane = secrets.token_hex(8)
        self.seq = 0
        self.pid = _process[0]

    def next_number(self) -> int:
        self.seq += 1
        return self.seq

    def next_seq(self) -> str:
        return str(self.next_number())


class Link(Lane):
    """One connection and one lane; used by one write at a time.

    ``key`` is a key of the queue the link writes to: on a cluster, the link
    connects to the master serving its slot.
    """

    def __init__(self, client: Any, connect_timeout: float, key: str = "") -> None:
        super().__init__()
        self.client = client
        self.key = key
        self.connect_timeout = connect_timeout
        self.cluster = is_cluster_client(client)
        self.cache: dict[str, Any] = {}
        """Commands packed once for this link's lane (the owner's to fill)."""
        self.deadline: float | None = None
        """When the write under way gives up (``time.monotonic()``), set by the owner for each write: no wait of
        its tries (connecting, sending, reading) outlasts it. None: each wait is bounded by the connection's own
        socket timeout only."""
        self.conn = self._open(self._pool())
        self._reader = hiredis.Reader(replyError=redis.ResponseError)
        self._poller = select.poll()

    def _pool(self) -> Any:
        if not self.cluster:
            return self.client.connection_pool
        node = self.client.get_node_from_key(self.key)
        return self.client.get_redis_connection(node).connection_pool

    def _open(self, pool: Any) -> Any:
        # not from the pool: the link keeps its connection for good, and retries are ours
        kwargs = dict(pool.connection_kwargs, retry=Retry(NoBackoff(), 0))
        if kwargs.get("socket_connect_timeout") is None:
            kwargs["socket_connect_timeout"] = self.connect_timeout
        conn = pool.connection_class(**kwargs)
        self.raw = type(conn) in _RAW_CONNECTIONS
        self._timeouts = (conn.socket_connect_timeout, conn.socket_timeout)
        return conn

    def _wait(self) -> float | None:
        """How long the next wait may last: the connection's socket timeout, and no later than the deadline."""
        limit: float | None = self._timeouts[1]
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), LAST_WAIT)
            limit = left if limit is None else min(limit, left)
        return limit

    def _connect(self) -> None:
        """Connect (and say hello) within the write's deadline; a raw socket is then made non-blocking, since
        the link waits for it with ``poll``, bounded by ``_wait``."""
        conn = self.conn
        connect_timeout, socket_timeout = self._timeouts
        wait = self._wait()
        if wait is not None:  # redis-py's connect and handshake read these
            conn.socket_connect_timeout = wait if connect_timeout is None else min(connect_timeout, wait)
            conn.socket_timeout = wait if socket_timeout is None else min(socket_timeout, wait)
        try:
            conn.connect()
        finally:
            conn.socket_connect_timeout, conn.socket_timeout = connect_timeout, socket_timeout
        self._reader = hiredis.Reader(replyError=redis.ResponseError)
        self._poller = select.poll()
        sock = conn._sock
        assert sock is not None  # connect() opened it or raised
        if self.raw:
            sock.settimeout(0.0)  # every read and write a plain syscall: no poll inside Python's socket per call
        self._poller.register(sock, select.POLLIN)

    def follow(self, error: BaseException) -> None:
        """Before a retry on a cluster: point the link at the master serving its slot now.

        A ``MOVED`` reply names the new master; a connection error may mean its
        master died and a replica took over, so the layout is read again.
        """
        if not self.cluster:
            return
        nodes = self.client.nodes_manager
        redirect = moved(error)
        try:
            if redirect is not None:
                nodes.move_slot(redirect)
            else:
                nodes.initialize()
        except redis.RedisError:
            return  # nothing answers yet: the next try asks again
        node = self.client.get_node_from_key(self.key)
        if (self.conn.host, self.conn.port) == (node.host, node.port):
            return
        self.reset()
        self.conn = self._open(self.client.get_redis_connection(node).connection_pool)

    @property
    def server(self) -> str:
        return server_of(self.conn)

    def send(self, packed: bytes) -> None:
        """Send packed commands; on failure the exception's ``sent`` is False: they cannot have run."""
        try:
            self._send(packed)
        except BaseException as exc:
            self.reset()
            exc.sent = False  # type: ignore[attr-defined]
            raise

    def receive(self, count: int) -> list[Any]:
        """Read ``count`` replies; raise the first error reply, after reading them all.

        An exception raised here has ``sent`` True: the commands reached the
        server in full and may have run.
        """
        try:
            replies = self._receive(count)
        except BaseException as exc:
            self.reset()  # a reply may still be on its way: never read it as the next one's
            exc.sent = True  # type: ignore[attr-defined]
            raise
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                reply.sent = True  # type: ignore[attr-defined]
                raise reply
        return replies

    def _send(self, packed: bytes) -> None:
        conn = self.conn
        if self.raw and conn._sock is not None and self._poller.poll(0):
            # something to read before anything was asked: the server closed the
            # connection (a restart). Reconnect rather than send into it, so a
            # failure here is known not to have run.
            self.reset()
        if conn._sock is None:
            self._connect()
        if not self.raw:
            wait = self._wait()
            if wait is not None and conn._sock is not None:
                conn._sock.settimeout(max(wait, 0.001))
            conn.send_packed_command([packed], check_health=False)
            return
        sock = conn._sock
        try:
            try:
                sent = sock.send(packed)
            except BlockingIOError:
                sent = 0
            if sent < len(packed):
                self._send_rest(sock, memoryview(packed)[sent:])
        except OSError as exc:
            raise redis.ConnectionError(f"Error while writing to {self.server}: {exc}") from None

    def _send_rest(self, sock: socket.socket, view: memoryview) -> None:
        """What one ``send`` did not take (a bulk chunk larger than the socket's buffer): sent as room frees."""
        writable = select.poll()
        writable.register(sock, select.POLLOUT)
        while view:
            if not writable.poll(_poll_ms(self._wait())):
                raise redis.TimeoutError(f"Timeout writing to {self.server}")
            try:
                view = view[sock.send(view):]
            except BlockingIOError:
                continue

    def _receive(self, count: int) -> list[Any]:
        if not self.raw:
            out = []
            for _ in range(count):
                try:
                    out.append(self.conn.read_response(timeout=self._wait()))
                except redis.ResponseError as exc:
                    out.append(exc)
            return out
        reader = self._reader
        out = []
        while len(out) < count:
            reply = reader.gets()
            if reply is False:
                reader.feed(self._recv())
            else:
                out.append(reply)
        return out

    def _recv(self) -> bytes:
        """What has arrived; polls the non-blocking socket up to ``SPINS`` times before it sleeps in ``poll``.

        A reply usually arrives within tens of µs, sooner than a sleeping
        thread wakes up on a virtual machine, so polling briefly costs less
        CPU than sleeping, not more. The sleep is bounded by ``_wait``.
        """
        sock = self.conn._sock
        try:
            for _ in range(SPINS):
                try:
                    data: bytes = sock.recv(65536)
                    break
                except BlockingIOError:
                    pass
            else:
                while True:
                    if not self._poller.poll(_poll_ms(self._wait())):
                        raise redis.TimeoutError(f"Timeout reading from {self.server}")
                    try:
                        data = sock.recv(65536)
                        break
                    except BlockingIOError:
                        pass
        except OSError as exc:
            raise redis.ConnectionError(f"Error while reading from {self.server}: {exc}") from None
        if not data:
            raise redis.ConnectionError(f"Connection closed by {self.server}")
        return data

    def reset(self) -> None:
        """Drop the connection (reconnect on the next call); the lane stays."""
        with contextlib.suppress(Exception):
            self.conn.disconnect()
        self._reader = hiredis.Reader(replyError=redis.ResponseError)

    def close(self) -> None:
        self.reset()

