"""One sampler per server process: reads Redis once a tick for every tab.

The first websocket that opens starts the sampler (an asyncio task on the
server's event loop); each tick it takes one reading of all queues in a
worker thread (pipelined calls, see ``readings``), renders the fragment of
every topic some socket of this process watches, and sends each to that
topic's Channels group. When the last socket closes, the task ends. Ten tabs
on the overview cost the same Redis reads as one.

The polling fallback (``views.live_fragment``) renders through the same
sampler, so its answers share the reader's cached history.

Failures do not wait for the next tick: between ticks the loop looks, every
``WATCH_INTERVAL`` seconds, at the all-time ``failed`` and ``dlq`` counters of
the queues it shows (one pipelined HMGET per queue, ``engine/ops/totals.py``)
and ticks at once when they moved, so a burst's first failure reaches the
open tabs within about a fifth of a second of being settled rather than up to
a tick later. Watching the events stream instead would mean reading every
completion batch the workers write; the counters answer "did anything fail?"
with a few bytes whatever the throughput.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.models import Operation
from chasqui_core.services import background
from chasqui_core.services.common import known_queues, redis_client

from . import fragments
from .readings import Reader, Reading
from .topics import Topic
import contextlib

logger = logging.getLogger("chasqui.console")

ERROR_LOG_INTERVAL = 30
"""Seconds between two logged failures of the sampler, so an outage does not flood the log."""

MESSAGE_TYPE = "live.fragment"
"""Channels message type; the consumer's ``live_fragment`` handler receives it."""


def interval() -> float:
    return float(getattr(settings, "CHASQUI_SAMPLER_INTERVAL", 1.0))


WATCH_INTERVAL = 0.2
"""Seconds between two looks at the failure counters while waiting for the next tick."""
WATCHED = ("failed", "dlq")
"""All-time counters whose change triggers a tick at once."""


class Sampler:
    def __init__(self) -> None:
        self._reader: Reader | None = None
        self._reader_lock = threading.Lock()
        self._counts: Counter[Topic] = Counter()
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._last_error = float("-inf")
        self.ticks = 0
        """Completed ticks since the process started (for tests and debugging)."""
        self.early_ticks = 0
        """Ticks taken at once because a failure counter moved (for tests and the bench)."""
        self._queues: list[str] = []
        """The queues of the last reading: those whose failure counters are watched."""
        self._failures: int | None = None
        """Their failure counters' sum when last looked at (None: not yet)."""

    # --- reading and rendering (sync, any thread) --------------------------------

    @property
    def reader(self) -> Reader:
        with self._reader_lock:
            client = redis_client()
            # a new client (settings changed, or the backend's first one after Redis answered at last) gets a new
            # reader: a reader must not keep a client the backend has let go
            if self._reader is None or self._reader.client is not client:
                self._reader = Reader(client)
            return self._reader

    def read(self, topics: list[Topic] | tuple[Topic, ...] = ()) -> Reading:
        queues = set(known_queues())
        queues.update(t.queue for t in topics if t.queue)
        self._queues = sorted(queues)
        return self.reader.read(self._queues)

    def failures(self) -> int:
        """The sum of the watched queues' all-time failure counters: one round trip."""
        queues = self._queues
        if not queues:
            return 0
        pipe = self.reader.client.pipeline(transaction=False)
        for name in queues:
            pipe.hmget(QueueKeys.for_queue(name).totals, *WATCHED)
        return sum(int(v) for reply in pipe.execute() for v in reply if v is not None)

    def _failures_moved(self) -> bool:
        seen = self.failures()
        moved = self._failures is not None and seen != self._failures
        self._failures = seen
        return moved

    def render(self, topics: list[Topic]) -> dict[Topic, str]:
        """The fragment of each topic, from one reading."""
        try:
            needs_redis = any(t.kind != "operation" for t in topics)
            reading = self.read(topics) if needs_redis else None
            op_ids = [t.arg for t in topics if t.kind == "operation"]
            operations = {str(op.pk): op for op in Operation.objects.filter(pk__in=op_ids)} if op_ids else {}
            background.refresh(operations.values())  # the workers' progress, from Redis
            return {t: fragments.render(t, reading, operations) for t in topics}
        finally:
            close_old_connections()

    def _look_and_render(self, topics: list[Topic]) -> dict[Topic, str]:
        """A tick's work: note the failure counters, then read and render. Looked at before the reading, a
        failure settled after the look is either in the reading or moves the counters for the next look."""
        if self._queues:
            self._failures_moved()
        return self.render(topics)

    # --- the live loop (event loop side) --------------------------------------------

    @property
    def topics(self) -> list[Topic]:
        return sorted(self._counts)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def subscribe(self, topic: Topic) -> None:
        """A socket started watching ``topic``: make sure the loop runs, and tick now."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._task.get_loop() is not loop:
            # A previous event loop (tests run one per test) ended with its sockets.
            self._task, self._counts = None, Counter()
        self._counts[topic] += 1
        if not self.running:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="chasqui-console-sampler")
        self.wake()

    def unsubscribe(self, topic: Topic) -> None:
        self._counts[topic] -= 1
        if self._counts[topic] <= 0:
            del self._counts[topic]
        if not self._counts:
            self.wake()  # let the loop notice it has nobody left to serve

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def tick(self) -> dict[Topic, str]:
        """Read, render and send once, for the topics watched right now."""
        topics = self.topics
        if not topics:
            return {}
        rendered = await sync_to_async(self._look_and_render, thread_sensitive=False)(topics)
        layer = get_channel_layer()
        for topic, html in rendered.items():
            await layer.group_send(topic.group, {"type": MESSAGE_TYPE, "html": html})
        self.ticks += 1
        return rendered

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while self._counts:
            wake.clear()
            started = time.monotonic()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a Redis blip must not end live updates for good
                now = time.monotonic()
                if now - self._last_error >= ERROR_LOG_INTERVAL:
                    self._last_error = now
                    logger.exception("The console sampler could not take a reading; it keeps trying "
                                     "(logged at most every %d s)", ERROR_LOG_INTERVAL)
            await self._pause(wake, started + max(0.05, interval() - (time.monotonic() - started)))
        self._task = None

    async def _pause(self, wake: asyncio.Event, until: float) -> None:
        """Wait for the next tick: until ``until`` (monotonic), a wake-up, or a failure counter that moved."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(wake.wait(), timeout=min(left, WATCH_INTERVAL))
                await asyncio.sleep(0.05)  # several sockets opening at once share one tick
                return
            except TimeoutError:
                pass
            if time.monotonic() >= until or not self._queues:
                continue
            try:
                moved = await sync_to_async(self._failures_moved, thread_sensitive=False)()
            except Exception:  # the tick that follows reports Redis's trouble
                return
            if moved:
                self.early_ticks += 1
                return

    async def stop(self) -> None:
        """Cancel the loop (tests); sockets still open stop getting updates."""
        task, self._task = self._task, None
        self._counts.clear()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


_sampler = Sampler()


def get_sampler() -> Sampler:
    """This process's sampler."""
    return _sampler
