"""What one worker holds: every delivery it has read and not yet handed to the settler.

``InFlight`` is the one owner of those deliveries, and changes only through
its methods: admission adds each delivery it accepts (``add``), and a
delivery leaves when its run's outcome is handed to the settler, when it goes
back to the stream unstarted, or when it is refused after admission
(``remove``). The lease keeper, the heartbeat, the cancel watch and the deadline
watcher only read. Sync lane threads never change it; they only stamp a
delivery's ``started`` when its handler begins.

Whatever a worker reads is, at every moment, in exactly one of three places:
held here, queued on the settler, or given back to the stream
(tests/engine/test_inflight.py holds that invariant).
"""

from __future__ import annotations

from collections.abc import Iterator

from chasqui_core.engine.worker.delivery import Delivery, DeliveryRef
from chasqui_core.engine.store.keys import QueueKeys


class InFlight:
    """The deliveries a worker holds, by reference, from the read until their outcome is handed to the settler."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[DeliveryRef, Delivery] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, ref: object) -> bool:
        """Whether the delivery of ``ref`` (a ``DeliveryRef``) is held."""
        return ref in self._held

    def get(self, ref: DeliveryRef) -> Delivery | None:
        """The delivery held for ``ref``, if any."""
        return self._held.get(ref)

    def holds(self, d: Delivery) -> bool:
        """Whether this very delivery is still held (not settled, given back or taken back)."""
        return self._held.get(d.ref) is d

    def add(self, d: Delivery) -> None:
        """Hold a delivery just admitted; a second read of a held entry is refused by admission before this."""
        self._held[d.ref] = d

    def remove(self, d: Delivery) -> bool:
        """Let a delivery go; False when it was not held (its outcome was written already, or it was taken back)."""
        return self._held.pop(d.ref, None) is not None

    def __iter__(self) -> Iterator[Delivery]:
        """A snapshot: callers may add and remove while they walk it."""
        return iter(list(self._held.values()))

    def by_stream(self, keys: QueueKeys) -> list[bytes]:
        """Entry ids held from one stream (a queue's band: for the lease keeper)."""
        stream = keys.stream
        return [ref.entry_id for ref in list(self._held) if ref.stream == stream]

    def running(self) -> list[Delivery]:
        """Deliveries whose handler has started, the longest running first."""
        started = [d for d in list(self._held.values()) if d.started]
        started.sort(key=lambda d: d.started)
        return started
