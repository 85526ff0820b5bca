"""Producers across a Redis restart, a failover and a lost reply: retried, then a clear error, never a duplicate.

Each test runs its own Valkey (EmbeddedValkey), since it stops, restarts or
demotes the server. A lost reply is made by a small TCP proxy between the
producer and the server that lets one write through, swallows its reply and
drops the connection: the write ran, the producer cannot know.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import redis

from chasqui_core.engine.store.embedded import EmbeddedValkey
from chasqui_core.engine.jobs.errors import EnqueueUnavailable
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.store.scripts import source

KEYS = QueueKeys.for_queue("outage")


@pytest.fixture
def server(tmp_path):
    valkey = EmbeddedValkey(tmp_path / "valkey", appendonly=True)
    valkey.start()
    yield valkey
    valkey.stop()


def job_ids_in_stream(client: redis.Redis) -> list[str]:
    from chasqui_core.engine.jobs.envelope import decode

    return [decode(fields[b"j"]).id for _, fields in client.xrange(KEYS.stream)]


class LosingProxy:
    """Forwards 127.0.0.1:<port> to a server; when armed, the next write containing ``marker``
    reaches the server, its reply is swallowed and the client's connection is closed."""

    def __init__(self, upstream_port: int, marker: bytes = b"EVALSHA") -> None:
        self.upstream_port = upstream_port
        self.marker = marker
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        swallow = threading.Event()  # this connection's replies are lost from now on
        threading.Thread(target=self._pump, args=(upstream, client, swallow), daemon=True).start()
        try:
            while data := client.recv(65536):
                if self.armed.is_set() and self.marker in data:
                    self.armed.clear()
                    swallow.set()
                    upstream.sendall(data)
                    client.settimeout(0.3)  # pass on the rest of the write, then cut
                    try:
                        while more := client.recv(65536):
                            upstream.sendall(more)
                    except TimeoutError:
                        pass
                    self.cut.set()
                    break
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    @staticmethod
    def _pump(upstream: socket.socket, client: socket.socket, swallow: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if not swallow.is_set():
                    client.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_an_add_rides_out_a_server_restart_and_lands_once(server):
    direct = redis.Redis(port=server.port)
    queue = Queue("outage", url=server.url, retry_for=60)
    queue.add("tasks.first")  # connected, script cached: the restart is what the next add meets
    server.stop()
    # down longer than redis-py's own reconnect attempts last, well inside the producer's window
    restarter = threading.Timer(6.0, server.start)
    restarter.start()
    try:
        added = queue.add("tasks.during_restart")
    finally:
        restarter.join()
    assert added.entry_id is not None
    assert job_ids_in_stream(direct).count(added.job_id) == 1
    assert direct.xlen(KEYS.stream) == 2
    queue.close()


def test_a_server_down_longer_than_the_window_gives_one_clear_error(server):
    direct = redis.Redis(port=server.port)
    direct.config_set("requirepass", "s3cret-pw")
    queue = Queue("outage", url=f"redis://:s3cret-pw@127.0.0.1:{server.port}/0", retry_for=1.0)
    queue.add("tasks.first")
    server.stop()
    with pytest.raises(EnqueueUnavailable) as caught:
        queue.add("tasks.lost")
    message = str(caught.value)
    assert f"127.0.0.1:{server.port}" in message
    assert "s3cret-pw" not in message
    assert "queue 'outage'" in message and "Nothing was added" in message
    assert "ConnectionError" in message  # the cause, in words
    assert caught.value.maybe_added is False
    assert caught.value.server == f"127.0.0.1:{server.port}"
    assert len(caught.value.job_ids) == 1
    queue.close()


def test_a_bulk_add_that_fails_says_which_chunks_went_through(server):
    queue = Queue("outage", url=server.url, retry_for=0.5, chunk_size=10)
    queue.add("tasks.first")

    def jobs():
        for i in range(30):
            if i == 10:  # the first chunk is sent: let it land, then stop the server before the second
                time.sleep(0.5)
                server.stop()
            yield JobSpec("tasks.bulk", [i])

    with pytest.raises(EnqueueUnavailable) as caught:
        queue.add_bulk(jobs())
    assert [e.entry_id is not None for e in caught.value.added] == [True] * 10
    assert len(caught.value.job_ids) == 10
    assert caught.value.maybe_added is False
    server.start()
    assert redis.Redis(port=server.port).xlen(KEYS.stream) == 11
    queue.close()


def test_a_write_whose_reply_was_lost_is_not_added_twice(server):
    direct = redis.Redis(port=server.port)
    direct.script_load(source("enqueue"))
    proxy = LosingProxy(server.port, marker=b"tasks.lost_reply")
    queue = Queue("outage", url=f"redis://127.0.0.1:{proxy.port}/0", retry_for=30)
    queue.add("tasks.first")
    proxy.armed.set()
    added = queue.add("tasks.lost_reply")
    assert proxy.cut.is_set()  # the reply really was lost
    assert job_ids_in_stream(direct).count(added.job_id) == 1
    assert direct.xlen(KEYS.stream) == 2
    # the reply the producer returns is the first write's: its real stream entry
    assert direct.xrange(KEYS.stream)[-1][0].decode() == added.entry_id
    queue.close()
    proxy.close()


def test_a_bulk_chunk_whose_reply_was_lost_is_not_added_twice(server):
    direct = redis.Redis(port=server.port)
    direct.script_load(source("enqueue"))
    proxy = LosingProxy(server.port, marker=b"tasks.lost_bulk")
    queue = Queue("outage", url=f"redis://127.0.0.1:{proxy.port}/0", retry_for=30)
    queue.add("tasks.first")
    proxy.armed.set()
    added = queue.add_bulk(JobSpec("tasks.lost_bulk", [i]) for i in range(500))
    assert proxy.cut.is_set()
    assert direct.xlen(KEYS.stream) == 501
    assert sorted(job_ids_in_stream(direct)[1:]) == sorted(e.job_id for e in added)
    queue.close()
    proxy.close()


def test_an_async_write_whose_reply_was_lost_is_not_added_twice(server):
    direct = redis.Redis(port=server.port)
    direct.script_load(source("enqueue"))
    proxy = LosingProxy(server.port, marker=b"tasks.lost_async")
    queue = Queue("outage", url=f"redis://127.0.0.1:{proxy.port}/0", retry_for=30)

    async def scenario():
        await queue.aadd("tasks.first")
        proxy.armed.set()
        added = await queue.aadd("tasks.lost_async")
        await queue.aclose()
        return added

    added = asyncio.run(scenario())
    assert proxy.cut.is_set()
    assert job_ids_in_stream(direct).count(added.job_id) == 1
    assert direct.xlen(KEYS.stream) == 2
    proxy.close()


def test_a_replica_promoted_within_the_window_takes_the_add_once(server, tmp_path):
    with EmbeddedValkey(tmp_path / "replica", appendonly=False) as replica:
        demoted = redis.Redis(port=replica.port)
        demoted.replicaof("127.0.0.1", server.port)  # writes now answer READONLY, as on a failed-over primary
        queue = Queue("outage", url=replica.url, retry_for=60)
        promote = threading.Timer(1.0, lambda: demoted.replicaof("NO", "ONE"))
        promote.start()
        try:
            added = queue.add("tasks.failover")
        finally:
            promote.join()
        assert job_ids_in_stream(demoted) == [added.job_id]
        queue.close()


def test_a_replica_that_stays_read_only_gives_one_clear_error(server, tmp_path):
    with EmbeddedValkey(tmp_path / "replica", appendonly=False) as replica:
        redis.Redis(port=replica.port).replicaof("127.0.0.1", server.port)
        queue = Queue("outage", url=replica.url, retry_for=0.5)
        with pytest.raises(EnqueueUnavailable) as caught:
            queue.add("tasks.readonly")
        assert "READONLY" in str(caught.value) and f"127.0.0.1:{replica.port}" in str(caught.value)
        assert caught.value.maybe_added is False
        queue.close()


def test_retry_for_is_checked():
    with pytest.raises(ValueError, match="retry_for"):
        Queue("outage", redis_client=redis.Redis(), retry_for=-1)


@pytest.mark.parametrize("connected", [True, False], ids=["connected", "connecting"])
def test_an_add_cut_off_by_a_blackhole_gives_up_when_its_window_closes(server, connected):
    from bench.faultproxy import FaultProxy

    with FaultProxy(server.port) as proxy:
        queue = Queue("outage", url=proxy.url, retry_for=2.0)
        if connected:
            queue.add("tasks.first")  # the link's connection is open when the network goes silent
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(EnqueueUnavailable) as caught:
            queue.add("tasks.partitioned")
        took = time.monotonic() - started
        # the window is 2 s; a silent server used to hold each try for its socket timeout (5 s) on top of it
        assert 1.9 <= took < 4.5, took
        assert "TimeoutError" in str(caught.value)
        proxy.heal()
        queue.close()


def test_an_async_add_cut_off_by_a_blackhole_gives_up_when_its_window_closes(server):
    from bench.faultproxy import FaultProxy

    with FaultProxy(server.port) as proxy:
        queue = Queue("outage", url=proxy.url, retry_for=2.0)

        async def scenario() -> float:
            await queue.aadd("tasks.first")
            proxy.blackhole()
            started = time.monotonic()
            with pytest.raises(EnqueueUnavailable):
                await queue.aadd("tasks.partitioned")
            took = time.monotonic() - started
            proxy.heal()
            await queue.aclose()
            return took

        took = asyncio.run(scenario())
        assert 1.9 <= took < 4.5, took
