"""The DLQ index's sorted sets read in the stream's order: scores, positions, walks newest or oldest first.

Every value the index keeps (a task, a reason, an error group) is a sorted
set of entry ids scored by the id itself, so a filter's page is a walk over
one set, or over the union of several (an error class is the union of its
groups' sets), kept to the ids found in the other values' sets. ``DLQIndex``
(index.py) decides which sets; this module reads them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.dlq.entries import Row, StreamId, id_after, id_of

SEQ_SLOTS = 2048
"""An entry's score is its id's millisecond * SEQ_SLOTS + its sequence number (capped at SEQ_SLOTS - 1): the
stream's own order, exact in a double until 2109; ids past the cap in one millisecond order by their bytes."""

Position = tuple[int, bytes]
"""Where a walk stands: an entry's score and its id, in the index's order (newest first; equal scores in
reverse byte order, as Redis gives them)."""


def score_of(sid: tuple[int, int]) -> int:
    """An entry id's score in the index's sorted sets."""
    return sid[0] * SEQ_SLOTS + min(sid[1], SEQ_SLOTS - 1)


def low_bound(lo: int | None) -> str:
    return "-inf" if lo is None else str(lo)


def high_bound(hi: int | None) -> str:
    return "+inf" if hi is None else str(hi)



class IndexSets:
    """Walks over one queue's index sets, on a sync client returning bytes."""

    def __init__(self, client: Client, keys: QueueKeys) -> None:
        self.client = client
        self.keys = keys

    def ascend(self, keys: list[str], start: StreamId | None, lo: int | None, hi: int | None,
                chunk: int) -> Iterator[list[Position]]:
        """The ids of a union of sorted sets in stream order (oldest first), from ``start`` or score ``lo``.

        Members sharing a score (the SEQ_SLOTS-th entry of a millisecond
        and those after it) are in byte order in Redis, not in the stream's;
        so a step that stops on such a score leaves it to the next step, which
        reads it whole, and each step orders its ids by id.
        """
        cursor = start
        while True:
            pipe = self.client.pipeline(transaction=False)
            low = low_bound(lo) if cursor is None else f"({score_of(cursor)}"
            for key in keys:
                if cursor is not None:
                    s = score_of(cursor)
                    pipe.zrangebyscore(key, s, s, withscores=True)
                pipe.zrangebyscore(key, low, high_bound(hi), start=0, num=chunk, withscores=True)
            replies = pipe.execute()
            found: dict[bytes, int] = {}
            bound = None
            step = 1 if cursor is None else 2
            for k in range(len(keys)):
                if cursor is not None:
                    for member, score in replies[k * step]:
                        if id_of(member) >= cursor and (hi is None or score <= hi):
                            found[member] = int(score)
                above = replies[k * step + step - 1]
                for member, score in above:
                    found[member] = int(score)
                last = int(above[-1][1]) if above else 0
                if len(above) == chunk and last % SEQ_SLOTS == SEQ_SLOTS - 1:
                    # cut short on a shared score: it may have more members, and in byte order
                    bound = last if bound is None else min(bound, last)
            keep = [(score, member) for member, score in found.items() if bound is None or score < bound]
            if not keep and bound is not None:  # a whole step of one score: read that score whole
                pipe = self.client.pipeline(transaction=False)
                for key in keys:
                    pipe.zrangebyscore(key, bound, bound, withscores=True)
                for reply in pipe.execute():
                    for member, score in reply:
                        if cursor is None or id_of(member) >= cursor:
                            keep.append((int(score), member))
                keep = list(dict.fromkeys(keep))
            keep.sort(key=lambda pos: (pos[0], id_of(pos[1])))
            batch = keep[:chunk]
            if batch:
                yield batch
            if bound is None and len(keep) <= chunk and all(len(r) < chunk for r in replies[step - 1::step]):
                return
            nxt = id_after(id_of(batch[-1][1]))
            if nxt is None:
                return
            cursor = nxt


    def walk(self, keys: list[str], start: Position | None, lo: int | None, hi: int | None,
              chunk: int) -> Iterator[list[Position]]:
        """The ids of a union of sorted sets within scores [lo, hi], newest first, after ``start``, ``chunk`` at a time.

        Each set gives its next ``chunk`` ids (and, after a position, the ids
        of that position's millisecond below it); the ``chunk`` newest of their
        union are exactly the union's next ``chunk``.
        """
        pos = start
        if pos is not None and hi is not None and pos[0] > hi:
            pos = None
        while True:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                if pos is None:
                    pipe.zrevrangebyscore(key, high_bound(hi), low_bound(lo), start=0, num=chunk, withscores=True)
                else:
                    pipe.zrevrangebyscore(key, pos[0], pos[0], withscores=True)
                    pipe.zrevrangebyscore(key, f"({pos[0]}", low_bound(lo), start=0, num=chunk, withscores=True)
            replies = pipe.execute()
            candidates: list[Position] = []
            if pos is None:
                for reply in replies:
                    candidates += [(int(score), member) for member, score in reply]
            else:
                in_range = lo is None or pos[0] >= lo
                for ties, below in zip(replies[::2], replies[1::2], strict=True):
                    if in_range:
                        candidates += [(int(score), member) for member, score in ties if member < pos[1]]
                    candidates += [(int(score), member) for member, score in below]
            batch = heapq.nlargest(chunk, candidates)
            if batch:
                yield batch
            if len(batch) < chunk:
                return
            pos = batch[-1]

    def intersect(self, batch: list[Position], others: list[tuple[list[str], int]]) -> list[Position]:
        """The positions whose id is in at least one set of every other value."""
        if not others or not batch:
            return batch
        members = [eid for _, eid in batch]
        pipe = self.client.pipeline(transaction=False)
        for keys, _ in others:
            for key in keys:
                pipe.zmscore(key, members)
        replies = iter(pipe.execute())
        keep = [True] * len(batch)
        for keys, _ in others:
            found = [False] * len(batch)
            for _key in keys:
                for i, score in enumerate(next(replies)):
                    if score is not None:
                        found[i] = True
            keep = [k and f for k, f in zip(keep, found, strict=True)]
        return [pos for pos, k in zip(batch, keep, strict=True) if k]

    def rows(self, ids: list[bytes]) -> list[Row | None]:
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for eid in ids:
            pipe.xrange(self.keys.dlq, eid, eid, count=1)
        return [found[0] if found else None for found in pipe.execute()]
