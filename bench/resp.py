"""Pipelined commands with as little client work as possible.

The Redis ceiling and the DLQ fill both want the server's speed, not a
client library's: commands are encoded to RESP bytes up front and written
in batches on one connection, and the replies are read back with hiredis.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import redis

Arg = bytes | str | int


def _bulk(arg: Arg) -> bytes:
    if isinstance(arg, str):
        arg = arg.encode()
    elif isinstance(arg, int):
        arg = str(arg).encode()
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def encode(command: Sequence[Arg]) -> bytes:
    return b"*%d\r\n" % len(command) + b"".join(_bulk(a) for a in command)


class RawPipe:
    """One connection taken from a client's pool, used for pre-encoded batches."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._conn = self._pool.get_connection()

    def __enter__(self) -> RawPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._pool.release(self._conn)
            self._conn = None

    def run(self, packed: bytes, count: int) -> list:
        """Send ``count`` encoded commands at once and return their replies."""
        self._conn.send_packed_command([packed], check_health=False)
        read = self._conn.read_response
        return [read() for _ in range(count)]

    def run_all(self, commands: Iterable[Sequence[Arg]], batch: int = 1000) -> list:
        replies: list = []
        chunk: list[bytes] = []
        for command in commands:
            chunk.append(encode(command))
            if len(chunk) >= batch:
                replies += self.run(b"".join(chunk), len(chunk))
                chunk = []
        if chunk:
            replies += self.run(b"".join(chunk), len(chunk))
        return replies
