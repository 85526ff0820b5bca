"""A worker's reader of one queue: XREADGROUP batches into the worker, whatever the server does.

The connection is the reader's alone, so shutdown can cut its BLOCK short
with CLIENT UNBLOCK, and the XREADGROUP command is packed once per batch size
and its raw reply read without redis-py's reply reshaping: this runs once per
batch on the hot path. On a cluster the connection goes to the master serving
the queue's slot; after a failover or a resharding (``MOVED``, or a node that
stopped answering) the reader reads the cluster's layout again and follows.

A queue with priority bands (priority.py) is read in one XREADGROUP over
every band's stream, highest first; the set of the queue's bands is read
with each batch, so a band's first job is read at most one BLOCK later.

A reader never ends before its worker stops. A server that restarts answers
``LOADING`` for a while, a failed-over one ``READONLY`` or ``MASTERDOWN``, and
anything else unexpected may happen: each is logged, the connection is
dropped, and the reader tries again after a backoff (0.1 s doubling to 2 s).
A reader that died silently would leave its worker heartbeating, holding
locks and reading nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from typing import Any, Protocol

from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError

from chasqui_core.engine.store.connection import Client, aconnect, node_url
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.link import unavailable
from chasqui_core.engine.worker.log_budget import LogBudget

logger = logging.getLogger("chasqui.worker")

BACKOFF_S = (0.1, 2.0)
"""First and longest wait between tries of a failing reader."""


class ReaderHost(Protocol):
    """What a reader reads from the worker it serves (worker.Worker is one)."""

    id: str
    url: str | None
    client: Client
    cluster: bool
    journal: StartJournal
    block_ms: int
    batch_size: int
    paused: dict[str, bool]
    quiet: bool
    problem: str
    streams: dict[str, list[QueueKeys]]

    @property
    def stopping(self) -> asyncio.Event: ...

    async def sleep_unless_stopped(self, seconds: float) -> None: ...

    def learn_bands(self, keys: QueueKeys, bands: Collection[bytes | str]) -> bool: ...

    async def create_group(self, keys: QueueKeys) -> None: ...


class Intake(Protocol):
    """Where a reader hands what it read (running.Runner is one)."""

    def room_to_read(self, batch_size: int) -> int | None: ...

    async def wait_room(self) -> None: ...

    async def take(self, keys: QueueKeys, entries: list[Any], cancels: bytes | None = ...) -> None: ...

    async def take_bands(self, reads: list[tuple[QueueKeys, list[Any]]], cancels: bytes | None) -> None: ...


class Reader:
    def __init__(self, worker: ReaderHost, intake: Intake, keys: QueueKeys) -> None:
        self.worker = worker
        self.intake = intake
        self.keys = keys
        self.client_id: tuple[int, Any] | None = None
        """(client id of the reader's connection, the cluster node it is on or None), for CLIENT UNBLOCK."""
        self._failures = LogBudget(logger, f"failed reads on {keys.queue}", per_second=1)

    async def run(self) -> None:
        w, intake, keys = self.worker, self.intake, self.keys
        stop = w.stopping
        reader: Any = None
        packed: dict[int, Any] = {}
        by_name: dict[bytes, QueueKeys] = {}
        """The streams the packed read names (each queue's own and its bands'), by name."""
        wait = BACKOFF_S[0]
        try:
            while not stop.is_set():
                if w.paused[keys.queue] or w.quiet:  # paused queue, or the worker quieted (control.py)
                    await w.sleep_unless_stopped(0.5)
                    continue
                count = intake.room_to_read(w.batch_size)
                if count is None:
                    await intake.wait_room()
                    continue
                try:
                    if reader is None:
                        reader, node = await self._open()
                        self.client_id = (await reader.client_id(), node)
                        packed.clear()
                    conn = reader.connection
                    assert conn is not None  # client_id() above connected it
                    command = packed.get(count)
                    if command is None:  # the read, the version of the queue's cancel record (cancel.py), its bands
                        streams = w.streams[keys.queue]
                        by_name = {k.stream.encode(): k for k in streams}
                        command = packed[count] = conn.pack_commands([
                            ("XREADGROUP", "GROUP", GROUP, w.id, "COUNT", count, "BLOCK", w.block_ms,
                             "STREAMS", *[k.stream for k in streams], *[">"] * len(streams)),
                            ("GET", keys.cancel_version),
                            ("SMEMBERS", keys.bands)])
                    await conn.send_packed_command(command, check_health=False)
                    try:
                        reply = await conn.read_response()
                    except ResponseError:  # read the replies behind it: the connection stays in step
                        await conn.read_response()
                        await conn.read_response()
                        raise
                    cancels = await conn.read_response()
                    bands = await conn.read_response()
                    if len(bands) != len(by_name) - 1:  # a band is new to this read (or was learnt elsewhere)
                        w.learn_bands(keys, bands)
                        if len(w.streams[keys.queue]) != len(by_name):
                            packed.clear()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    reader = await self._failed(reader, exc, wait)
                    if reader is None:
                        await w.sleep_unless_stopped(wait)
                        wait = min(wait * 2, BACKOFF_S[1])
                    continue
                wait = BACKOFF_S[0]
                if reply:
                    # a map of stream -> entries under RESP3, a list of pairs under RESP2; highest band first
                    reads = reply.items() if type(reply) is dict else reply
                    if len(reads) == 1:
                        for name, entries in reads:
                            await intake.take(by_name[name], entries, cancels)
                    else:
                        await intake.take_bands([(by_name[name], entries) for name, entries in reads], cancels)
        finally:
            self.client_id = None
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.aclose()

    async def _failed(self, reader: Any, exc: Exception, wait: float) -> Any:
        """Deal with a failed read: the reader to go on with (None: reconnect after ``wait``)."""
        w, keys = self.worker, self.keys
        if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):  # a stream was deleted: make it again
            try:
                for k in w.streams[keys.queue]:
                    await w.create_group(k)
                return reader
            except Exception as again:
                exc = again
        if w.cluster and isinstance(exc, (AskError, ClusterDownError, TryAgainError)):  # MOVED is an ASK
            logger.info("reading %s: %s; following the cluster's new layout", keys.queue, exc)
        elif unavailable(exc):
            if self._failures.allow():
                logger.warning("reading %s failed (%s: %s); reconnecting in %.1f s", keys.queue,
                               type(exc).__name__, exc, wait)
        elif self._failures.allow():
            logger.error("reading %s failed unexpectedly; reconnecting in %.1f s", keys.queue, wait, exc_info=exc)
            w.problem = f"reading {keys.queue}: {type(exc).__name__}: {exc}"
        await self._drop(reader)
        return None

    async def _open(self) -> tuple[Any, Any]:
        """A single-connection client for this queue, and the cluster node it talks to (None off a cluster).

        The worker's start journal for the queue follows the reader to the same server.
        """
        w, keys = self.worker, self.keys
        if not w.cluster:
            for k in w.streams[keys.queue]:
                w.journal.use(k.stream, k.running(w.id), dispatching=k.dispatching(w.id))
            return aconnect(w.url, cluster=False, single_connection_client=True), None
        await w.client.initialize()
        node = w.client.get_node_from_key(keys.stream)
        url = node_url(w.client.chasqui_url, node.host, node.port)
        for k in w.streams[keys.queue]:
            w.journal.use(k.stream, k.running(w.id), url, dispatching=k.dispatching(w.id))
        return aconnect(url, cluster=False, single_connection_client=True), node

    async def _drop(self, reader: Any) -> None:
        """Close a reader that failed; on a cluster, read the layout again so the next one finds the slot's master."""
        self.client_id = None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.aclose()
        if self.worker.cluster:
            with contextlib.suppress(Exception):
                await self.worker.client.nodes_manager.initialize()

    async def unblock(self) -> None:
        """Cut a blocked XREADGROUP short (at shutdown)."""
        if self.client_id is None:
            return
        client_id, node = self.client_id
        with contextlib.suppress(Exception):
            if node is None:
                await self.worker.client.client_unblock(client_id)
            else:
                await self.worker.client.client_unblock(client_id, target_nodes=node)
