"""The soak's fault proxy (bench/faultproxy.py) against the tests' real server, on loopback.

Each fault is checked from the client's side with a bare socket speaking
RESP, so what the client sees is what the proxy did: no client library's
retries in between.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest
import redis as redis_lib

from bench.faultproxy import FaultProxy
from chasqui_core.engine.store.connection import is_cluster_client

PONG = b"+PONG\r\n"


@pytest.fixture
def upstream_port(redis, redis_url) -> int:
    parts = urlsplit(redis_url)
    if is_cluster_client(redis) or parts.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("the proxy forwards to one server, on loopback")
    return int(parts.port or 6379)


@pytest.fixture
def proxy(upstream_port):
    with FaultProxy(upstream_port) as p:
        yield p


def connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def ping(sock: socket.socket) -> bytes:
    sock.sendall(b"PING\r\n")
    return sock.recv(64)


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_it_forwards_a_client_s_commands_and_replies(proxy):
    client = redis_lib.Redis(port=proxy.port, socket_timeout=5)
    client.set("through-the-proxy", b"yes")
    assert client.get("through-the-proxy") == b"yes"
    assert client.pipeline().incr("n").incr("n").execute() == [1, 2]
    assert proxy.state().links == 1
    client.close()


def test_latency_holds_every_chunk_in_each_direction(proxy):
    with connect(proxy) as sock:
        assert ping(sock) == PONG
        proxy.set_latency(0.15)
        began = time.monotonic()
        assert ping(sock) == PONG
        assert time.monotonic() - began >= 0.25, "a round trip crosses the proxy twice"
        proxy.set_latency(0)
        assert ping(sock) == PONG
    with pytest.raises(ValueError):
        proxy.set_latency(-1)


def test_a_blackhole_forwards_nothing_until_it_heals_then_delivers_what_was_sent(proxy):
    with connect(proxy) as sock:
        assert ping(sock) == PONG
        proxy.blackhole()
        assert proxy.state().blackhole
        sock.settimeout(0.5)
        sock.sendall(b"PING\r\n")
        with pytest.raises(TimeoutError):
            sock.recv(64)
        with connect(proxy, timeout=0.5) as late, pytest.raises(TimeoutError):
            ping(late)  # a new connection is accepted, and stalls as well
        proxy.heal()
        sock.settimeout(5)
        assert sock.recv(64) == PONG, "held, not dropped: the stream stays whole"


def test_reset_ends_every_link_with_an_error_and_new_connections_work(proxy):
    with connect(proxy) as sock:
        assert ping(sock) == PONG
        assert proxy.reset() == 1
        with pytest.raises(ConnectionError):
            sock.sendall(b"PING\r\n")
            if not sock.recv(64):
                raise ConnectionResetError("closed")
    with connect(proxy) as sock:
        assert ping(sock) == PONG


def test_refusing_stops_listening_and_resets_the_links_until_it_heals(proxy):
    port = proxy.port
    with connect(proxy) as sock:
        assert ping(sock) == PONG
        proxy.refuse()
        assert proxy.state().refusing
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with pytest.raises(ConnectionError):
            sock.sendall(b"PING\r\n")
            if not sock.recv(64):
                raise ConnectionResetError("closed")
    proxy.heal()
    assert proxy.port == port, "the same port again, so clients reconnect to the same address"
    with connect(proxy) as sock:
        assert ping(sock) == PONG


def test_a_half_open_link_swallows_what_the_client_sends_and_says_nothing(proxy, redis):
    before = len(redis.client_list())
    with connect(proxy) as sock:
        assert ping(sock) == PONG
        assert wait_for(lambda: len(redis.client_list()) == before + 1)
        assert proxy.half_open() == 1
        assert wait_for(lambda: len(redis.client_list()) == before), "the server's side is gone"
        sock.settimeout(0.5)
        sock.sendall(b"PING\r\n")
        with pytest.raises(TimeoutError):
            sock.recv(64)  # no reply, and no FIN either: only the client's timeout can tell
        proxy.heal()
        with pytest.raises(TimeoutError):
            ping(sock)  # healing does not bring a half-open link back
        with connect(proxy) as fresh:
            assert ping(fresh) == PONG
    assert wait_for(lambda: proxy.state().links == 0), "the link ends when its client leaves"


def test_a_connection_while_the_server_is_away_is_reset(upstream_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]  # bound, never listening: connecting to it is refused
        # the reset may come as soon as the connect, or at the first read
        with FaultProxy(nobody) as p, pytest.raises(ConnectionError), connect(p) as sock:
            sock.sendall(b"PING\r\n")
            if not sock.recv(64):
                raise ConnectionResetError("closed")


def test_it_only_works_on_loopback_and_stop_closes_everything(upstream_port):
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy(upstream_port, upstream_host="192.0.2.1")
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy(upstream_port, host="0.0.0.0")
    p = FaultProxy(upstream_port)
    port = p.start()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert ping(sock) == PONG
    p.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    sock.settimeout(5)
    with pytest.raises(ConnectionError):
        sock.sendall(b"PING\r\n")
        if not sock.recv(64):
            raise ConnectionResetError("closed")
    sock.close()
