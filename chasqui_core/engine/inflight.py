"""What one worker holds: every delivery it has read and not yet settled.

A stream entry id is unique only within its stream: two queues written in the
same millisecond both get ``<ms>-0``, ``<ms>-1``, ... So a delivery is named by
its queue *and* its entry id (``DeliveryTag``), and every map the worker keeps
of its deliveries is keyed by that pair. ``InFlight`` is the one owner of
those deliveries: the reader adds them, the outcome of a run (or a requeue)
removes them, and the lease keeper, the heartbeat and the deadline watcher
read them. Sync lane threads never change the map; they only stamp a
delivery's ``started`` when its handler begins.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .keys import QueueKeys
    from .outcomes import Delivery


class DeliveryTag(NamedTuple):
    """A delivery's identity: its queue and its stream entry id (ids repeat across streams)."""

    queue: str
    entry_id: bytes


class InFlight:
    """The deliveries a worker holds, by tag, from the read until their outcome is handed to the settler."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[DeliveryTag, Delivery] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, tag: object) -> bool:
        return tag in self._held

    def add(self, d: Delivery) -> None:
        self._held[d.tag] = d

    def remove(self, d: Delivery) -> bool:
        """Forget a delivery; False when it was not held (already settled, or taken back)."""
        return self._held.pop(d.tag, None) is not None

    def __iter__(self) -> Iterator[Delivery]:
        """A snapshot: callers may add and remove while they walk it."""
        return iter(list(self._held.values()))

    def by_queue(self, keys: QueueKeys) -> list[bytes]:
        """Entry ids held on one queue (for the lease keeper)."""
        queue = keys.queue
        return [tag.entry_id for tag in list(self._held) if tag.queue == queue]

    def running(self) -> list[Delivery]:
        """Deliveries whose handler has started, the longest running first."""
        started = [d for d in list(self._held.values()) if d.started]
        started.sort(key=lambda d: d.started)
        return started
