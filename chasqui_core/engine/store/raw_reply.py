"""A command's reply as the bytes the server sent, for scans that look at bytes before they parse anything.

A text search reads a whole dead-letter queue. Parsing each entry into
Python objects costs more than reading it (hiredis makes a dozen objects an
entry), and a scan inside Redis spends most of its time turning entries into
Lua tables. Most chunks of a search hold no match, so the search reads each
chunk's reply as raw bytes, looks for its needle in them with one find in C,
and parses only a chunk where it found something (dlq/search.py).

Where a reply ends is not known without parsing it, so the command goes out
with a ``PING`` of a random token behind it, in one write: the reply ends
where the ``PING``'s (the token as a bulk string) begins. A token of 16
random bytes is never met inside a reply by chance. The connection is
borrowed from the client's pool (on a cluster, the pool of the node serving
the key) and goes back clean: both replies are read whole, and one that
fails half-way closes the connection.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import hiredis
import redis

from chasqui_core.engine.store.connection import is_cluster_client

_pack: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command
"""hiredis's own packer (its stub types one argument too narrowly)."""
READ_SIZE = 1 << 20
"""Bytes asked of the socket per read: a chunk of a few thousand entries arrives in a few reads."""


class RawReplies:
    """Commands on ``key``'s server whose replies are returned as raw RESP bytes (see the module's docstring).

    A reader that wants the next reply on its way while it looks at the last
    one holds a connection (``held``), sends (``send``) and receives
    (``receive``) in order; ``call`` does both."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self._conn: Any = None
        self._waiting: list[bytes] = []
        """The ends of the replies sent for and not read yet, in order."""

    def _pool(self) -> Any:
        if not is_cluster_client(self.client):
            return self.client.connection_pool
        node = self.client.get_node_from_key(self.key)
        return self.client.get_redis_connection(node).connection_pool

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One connection, borrowed from the pool, for the calls inside; it goes back clean (every reply sent for
        was read), or closed when something failed."""
        if self._conn is not None:
            yield
            return
        pool = self._pool()
        self._conn = conn = pool.get_connection()
        self._waiting = []
        try:
            yield
            for end in self._waiting:  # sent for and not wanted after all: read, so the connection is clean
                _read_until(conn, end)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._conn = None
            pool.release(conn)

    def send(self, *args: bytes) -> bytes:
        """Send one command (inside ``held``); returns what to ``receive`` its reply with."""
        token = os.urandom(8).hex().encode()
        end = b"$16\r\n%s\r\n" % token
        packed = _pack(args) + _pack((b"PING", token))
        self._conn.send_packed_command([packed], check_health=False)
        self._waiting.append(end)
        return end

    def receive(self, end: bytes) -> bytes:
        """The reply of the command ``send`` gave ``end`` for (replies come in the order sent). An error reply is
        raised (``redis.ResponseError``), as redis-py raises it."""
        while self._waiting[0] != end:  # an earlier one the caller no longer wants
            _read_until(self._conn, self._waiting.pop(0))
        raw = _read_until(self._conn, end)
        self._waiting.pop(0)
        if raw[:1] == b"-":
            reader = hiredis.Reader(replyError=redis.ResponseError)
            reader.feed(raw)
            error = reader.gets()
            raise error if isinstance(error, redis.ResponseError) else redis.ResponseError(raw[:200].decode())
        return raw

    def call(self, *args: bytes) -> bytes:
        """The reply of one command, as sent. An error reply is raised (``redis.ResponseError``); a connection
        that fails is closed and the error raised (``redis.ConnectionError``)."""
        with self.held():
            return self.receive(self.send(*args))

    def holds_entry(self, stream: bytes, entry_id: bytes, entry: bytes) -> bool:
        """Whether ``stream`` holds entry ``entry_id`` serialised exactly as ``entry`` (``stream_range_tail``'s
        check)."""
        return self.call(b"XRANGE", stream, entry_id, entry_id) == b"*1\r\n" + entry


def _read_until(conn: Any, end: bytes) -> bytes:
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection closed before its reply")
    parts: list[bytes] = []
    tail = b""
    while True:
        try:
            data = sock.recv(READ_SIZE)
        except OSError as exc:
            raise redis.ConnectionError(f"error while reading a reply: {exc}") from None
        if not data:
            raise redis.ConnectionError("the server closed the connection before its reply ended")
        parts.append(data)
        tail = data[-len(end):] if len(data) >= len(end) else (tail + data)[-len(end):]
        if tail == end:
            raw = b"".join(parts)
            return raw[:-len(end)]


def parse(raw: bytes) -> Any:
    """A raw reply parsed as redis-py's hiredis parser would (bytes, lists, integers)."""
    reader = hiredis.Reader(replyError=redis.ResponseError)
    reader.feed(raw)
    return reader.gets()


def stream_range_tail(raw: bytes, confirm: Callable[[bytes, bytes], bool]) -> tuple[int, bytes | None]:
    """The number of entries an ``XRANGE``/``XREVRANGE`` reply holds, and the id of its last one (None when it is
    empty), read without parsing the entries before it.

    The last entry's header is looked for from the end. A field's value may
    hold bytes that look like a header, so a header is taken only once the
    rest of the reply parses as exactly that entry and ``confirm(id,
    entry bytes)`` says the stream holds that entry, byte for byte (a value
    would have to copy a real entry of the stream whole to pass). Should no
    header pass, the whole reply is parsed."""
    newline = raw.index(b"\r\n")
    count = int(raw[1:newline])
    if count == 0:
        return 0, None
    at = len(raw)
    while True:
        at = raw.rfind(b"\r\n*2\r\n$", newline, at)
        if at < 0:
            rows = parse(raw)
            return len(rows), rows[-1][0]
        entry_id = _entry_ending_at(raw, at + 2)
        if entry_id is not None and confirm(entry_id, raw[at + 2:]):
            return count, entry_id


def _entry_ending_at(raw: bytes, at: int) -> bytes | None:
    """The id of the entry whose header starts at ``at``, if it runs exactly to the end of ``raw``."""
    try:
        at += 4  # "*2\r\n"
        entry_id, at = _bulk(raw, at)
        if raw[at:at + 1] != b"*":
            return None
        newline = raw.index(b"\r\n", at)
        fields = int(raw[at + 1:newline])
        at = newline + 2
        for _ in range(fields):
            _, at = _bulk(raw, at)
    except ValueError:
        return None
    return entry_id if at == len(raw) else None


def _bulk(raw: bytes, at: int) -> tuple[bytes, int]:
    """The bulk string at ``at`` and the position after it; ValueError if there is none."""
    if raw[at:at + 1] != b"$":
        raise ValueError("not a bulk string")
    newline = raw.index(b"\r\n", at)
    size = int(raw[at + 1:newline])
    start = newline + 2
    if size < 0 or raw[start + size:start + size + 2] != b"\r\n":
        raise ValueError("not a bulk string")
    return raw[start:start + size], start + size + 2
