"""A TCP proxy that misbehaves on demand: the network faults of the soak, on loopback only.

Clients connect to the proxy instead of the server; the proxy forwards each
connection to the server and can, at any moment and from any thread:

- add **latency**: every chunk is held this long in each direction (a round
  trip costs twice as much), order kept;
- **blackhole** the links: nothing is forwarded either way, no error either,
  and new connections are accepted and stall as well, as across a network
  partition; what was sent meanwhile is delivered when it heals, as TCP
  would after retransmitting;
- **reset** every link (an RST to both ends), once;
- **refuse** connections: it stops listening, so a connect is refused, and
  resets the links it had;
- make every link **half-open**: the server's side goes away and the
  client's stays open and silent (what it sends is swallowed, nothing comes
  back, no FIN): only the client's own timeouts can tell;
- **heal**: no latency, no blackhole, listening again.

It runs its own asyncio loop in a thread of its own, so a synchronous
program drives it with plain method calls. It only ever listens on and
connects to loopback addresses, holds at most ``max_connections`` links
(more are reset at once), and every link ends with ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

CHUNK = 65536
QUEUED_CHUNKS = 256
"""Chunks one direction of a link may hold while latency delays them; a full queue stops reading (backpressure)."""
CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 10.0
"""Seconds a caller waits for the proxy's loop to carry out one of its methods."""


def _loopback(host: str) -> str:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"the fault proxy only works on loopback addresses, got {host!r}") from None
    if not address.is_loopback:
        raise ValueError(f"the fault proxy only works on loopback addresses, got {host!r}")
    return host


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN: what a peer that lost the connection's state sends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    half_open: bool = False
    tasks: list[asyncio.Future] = field(default_factory=list)
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client's side of the link ended."""


@dataclass(frozen=True, slots=True)
class ProxyState:
    latency: float
    blackhole: bool
    refusing: bool
    links: int
    accepted: int
    """Connections accepted since the start (reset ones included)."""
    half_open: int = 0
    """Links left half-open whose clients have not yet noticed (and closed them)."""


class FaultProxy:
    """One listening port on 127.0.0.1 forwarding to one server on loopback."""

    def __init__(
        self,
        upstream_port: int,
        *,
        upstream_host: str = "127.0.0.1",
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = 512,
    ) -> None:
        self.upstream = (_loopback(upstream_host), upstream_port)
        self.host = _loopback(host)
        self.port = port
        self.max_connections = max_connections
        self._latency = 0.0
        self._accepted = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flowing: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # --- life ----------------------------------------------------------------------------------------

    def start(self) -> int:
        """Listen (on a free port unless one was given); returns the port."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start(), which raises it
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close_all())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"fault-proxy-{self.upstream[1]}", daemon=True)
        self._thread.start()
        if not ready.wait(CALL_TIMEOUT):
            raise RuntimeError("the fault proxy did not start")
        if failed:
            raise failed[0]
        return self.port

    def stop(self) -> None:
        """Close the port and every link; the proxy's thread ends."""
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT)
        self._thread = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- faults (call from any thread) ----------------------------------------------------------------

    def set_latency(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` in each direction (0: none)."""
        if not 0 <= seconds <= 60:
            raise ValueError(f"latency must be between 0 and 60 seconds, got {seconds}")
        self._latency = seconds

    def blackhole(self, on: bool = True) -> None:
        """Forward nothing, either way, until called with False (or ``heal``)."""
        self._call(self._set_flowing(not on))

    def reset(self) -> int:
        """Reset every link now; returns how many."""
        return self._call(self._reset_all())

    def refuse(self, on: bool = True) -> None:
        """Stop listening (connects are refused) and reset every link; with False, listen again on the same port."""
        self._call(self._refuse(on))

    def half_open(self) -> int:
        """Drop the server's side of every link, leaving the client's open and silent; returns how many."""
        return self._call(self._half_open_all())

    def heal(self) -> None:
        """No latency, no blackhole, listening. Half-open links stay as they are: only their clients can end them."""
        self._latency = 0.0
        self._call(self._heal())

    def state(self) -> ProxyState:
        assert self._flowing is not None
        return ProxyState(
            self._latency,
            not self._flowing.is_set(),
            self._server is None,
            len(self._links),
            self._accepted,
            sum(1 for link in list(self._links) if link.half_open),
        )

    # --- on the loop ------------------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None, "the proxy is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT)

    async def _listen(self) -> None:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_flowing(self, on: bool) -> None:
        assert self._flowing is not None
        if on:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _reset_all(self) -> int:
        links = list(self._links)
        for link in links:
            _rst(link.client)
            _rst(link.server)
        return len(links)

    async def _refuse(self, on: bool) -> None:
        if on and self._server is not None:
            server, self._server = self._server, None
            server.close()
            await self._reset_all()
        elif not on and self._server is None:
            await self._listen()

    async def _half_open_all(self) -> int:
        links = [link for link in self._links if not link.half_open]
        for link in links:
            link.half_open = True
            _rst(link.server)
        return len(links)

    async def _heal(self) -> None:
        await self._set_flowing(True)
        await self._refuse(False)

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        links = list(self._links)
        for link in links:
            _rst(link.client)
            _rst(link.server)
            for task in link.tasks:
                task.cancel()
        await asyncio.gather(*(t for link in links for t in link.tasks), return_exceptions=True)
        for _ in range(3):  # let each link's handler run its cleanup
            await asyncio.sleep(0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        if len(self._links) >= self.max_connections:
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT)
        except (TimeoutError, OSError):
            _rst(writer)  # the server is away: the client sees its connection fail, as it would connecting directly
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, link, to_server=True)),
            asyncio.ensure_future(self._pump(up_reader, writer, link, to_server=False)),
        ]
        try:
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in link.tasks:
                task.cancel()
            await asyncio.gather(*link.tasks, return_exceptions=True)
            self._links.discard(link)
            for w in (writer, up_writer):
                w.transport.abort()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link, *, to_server: bool
    ) -> None:
        """Forward one direction of a link: read and stamp each chunk; a sender writes it when it is due."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUED_CHUNKS)
        sender = asyncio.ensure_future(self._send(queue, dst, link))
        try:
            while True:
                try:
                    data = await src.read(CHUNK)
                except OSError:
                    data = b""
                if not data:
                    break
                if not link.half_open:
                    await queue.put((time.monotonic() + self._latency, data))
            if link.half_open and not to_server:
                # the server's side is gone, and the client must not hear of it: wait until the client leaves
                await link.client_gone.wait()
            await queue.put(None)
            await sender
        finally:
            sender.cancel()
            if to_server:
                link.client_gone.set()
            if to_server or not link.half_open:
                dst.transport.abort()
            if to_server and link.half_open:
                link.client.transport.abort()

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter, link: _Link
    ) -> None:
        assert self._flowing is not None
        while (item := await queue.get()) is not None:
            due, data = item
            await self._flowing.wait()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if link.half_open:
                continue
            dst.write(data)
            await dst.drain()
