"""What one worker holds: every delivery it has read and not yet settled.

A stream entry id is unique only within its stream: two queues, or two
priority bands of one queue, written in the same millisecond both get
``<ms>-0``, ``<ms>-1``, ... So a delivery is named by its stream *and* its
entry id (``DeliveryTag``), and every map the worker keeps of its deliveries
(here, the settler's batches, the start journal's marks) is keyed by stream. ``InFlight`` is the one owner of
those deliveries: the reader adds them, the outcome of a run (or a requeue)
removes them, and the lease keeper, the heartbeat and the deadline watcher
read them. Sync lane threads never change the map; they only stamp a
delivery's ``started`` when its handler begins.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .keys import QueueKeys
    from .outcomes import Delivery


DeliveryTag = tuple[str, bytes]
"""A delivery's identity: (its stream's key, its entry id), since entry ids repeat across streams.

A plain tuple rather than a named one: one is made per job read, and a
named tuple's constructor costs several times more.
"""


class InFlight:
    """The deliveries a worker holds, by tag, from the read until their outcome is handed to the settler."""

    __slots__ = ("by_tag",)

    def __init__(self) -> None:
        self.by_tag: dict[DeliveryTag, Delivery] = {}
        """The deliveries by tag. The reader's and the outcome's hot paths add and pop here directly, once per job:
        a method call each way would cost them more than the dict does; everything else uses the methods."""

    def __len__(self) -> int:
        return len(self.by_tag)

    def __contains__(self, tag: object) -> bool:
        return tag in self.by_tag

    def add(self, d: Delivery) -> None:
        self.by_tag[d.tag] = d

    def remove(self, d: Delivery) -> bool:
        """Forget a delivery; False when it was not held (already settled, or taken back)."""
        return self.by_tag.pop(d.tag, None) is not None

    def __iter__(self) -> Iterator[Delivery]:
        """A snapshot: callers may add and remove while they walk it."""
        return iter(list(self.by_tag.values()))

    def by_stream(self, keys: QueueKeys) -> list[bytes]:
        """Entry ids held from one stream (a queue's band: for the lease keeper)."""
        stream = keys.stream
        return [tag[1] for tag in list(self.by_tag) if tag[0] == stream]

    def running(self) -> list[Delivery]:
        """Deliveries whose handler has started, the longest running first."""
        started = [d for d in list(self.by_tag.values()) if d.started]
        started.sort(key=lambda d: d.started)
        return started
