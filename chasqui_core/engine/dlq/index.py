"""The DLQ's index: what the console asks of a big dead-letter queue, answered without scanning it.

The scripts that write and remove entries keep it, in the same atomic call
(``settle.lua``, ``dlq_move.lua``, ``dlq_discard.lua``, through
``lua/dlq_index.lua``, which describes the keys): counts per task, reason,
error class and fingerprint, a sorted set of entry ids under each of those
values (score = the entry's millisecond), the fingerprints' texts and tasks,
and each job id's entry. So a group count is a hash read, a filter's page is
a sorted-set range plus one XRANGE per row, and a job is one HGET away,
whatever the DLQ's size.

Combined filters walk the smallest of their sets, newest first, and keep the
ids found in the others (``ZMSCORE``, no entry read); only a text filter
reads entries. A walk stops after a caller-given number of ids and says where
to carry on, as a scan did.

An index is *ready* when it has this layout's version (the scripts record
it with the first entry they index), no rebuild is under
way, and it counts as many entries as the stream holds. Entries written
before the index existed (or by an older worker during a rolling upgrade, or
straight into the stream) leave it short; entries removed without it (an
older console's discard) leave it long. ``DLQIndex.advance`` then rebuilds,
a chunk per call (``dlq_reindex.lua``), and readers fall back to scanning
until it is ready again: counts are never shown from a half-built index.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import DLQ_INDEX_VERSION, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.dlq.entries import (Row, StreamId, decode_entry, field_text, format_id, id_of,
                                             parse_id)
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.fingerprint import error_group, fingerprint_id
from chasqui_core.engine.dlq.index_sets import SEQ_SLOTS, IndexSets, Position, high_bound, low_bound, score_of

INDEX_VERSION = DLQ_INDEX_VERSION
"""Written in the index's ``v`` hash; an index of another version is rebuilt."""

REBUILD_CHUNK = 1000
"""Entries indexed per ``dlq_reindex.lua`` call while rebuilding."""

WALK_CHUNK = 1000
"""Ids read per sorted set and round trip while walking a filter's index."""

READ_BUDGET_S = 0.2
"""Time a read may spend moving a rebuild on before it answers from a scan."""

_FINGERPRINT_ID = re.compile(r"[0-9a-f]{16}")



@dataclass(frozen=True, slots=True)
class IndexKeys:
    """The index's keys for one queue (see ``lua/dlq_index.lua``)."""

    prefix: str

    @classmethod
    def for_queue(cls, keys: QueueKeys) -> IndexKeys:
        return cls(keys.dlq + ":ix:")

    @property
    def counts(self) -> str:
        return self.prefix + "n"

    @property
    def groups(self) -> str:
        return self.prefix + "groups"

    @property
    def texts(self) -> str:
        return self.prefix + "fp"

    @property
    def jobs(self) -> str:
        return self.prefix + "jobs"

    @property
    def version(self) -> str:
        return self.prefix + "v"

    def task(self, name: str) -> str:
        return f"{self.prefix}t:{name}"

    def reason(self, name: str) -> str:
        return f"{self.prefix}r:{name}"

    @property
    def group_classes(self) -> str:
        """Error group id -> its error class: a class's entries are the union of its groups' sets."""
        return self.prefix + "fc"

    def group(self, fp: str) -> str:
        return f"{self.prefix}f:{fp}"

    def group_tasks(self, fp: str) -> str:
        return f"{self.prefix}ft:{fp}"


@dataclass(frozen=True, slots=True)
class IndexState:
    version: str | None
    rebuilding: bool
    indexed: int
    """Entries the index counts."""
    length: int
    """Entries in the stream."""

    @property
    def ready(self) -> bool:
        return self.version == INDEX_VERSION and not self.rebuilding and self.indexed == self.length


@dataclass(frozen=True, slots=True)
class Group:
    """One fingerprint as the index has it; ``browse.ErrorGroup`` is built from it."""

    id: str
    text: str
    count: int
    first_seen_ms: int
    last_seen_ms: int
    sample_entry_id: str
    tasks: list[str]


@dataclass(frozen=True, slots=True)
class Groups:
    groups: list[Group]
    total_groups: int
    """Fingerprints in the DLQ (``groups`` holds the biggest, up to the limit asked)."""
    other_entries: int
    """Entries in the fingerprints left out, so the counts shown add up to the DLQ's length."""


@dataclass(frozen=True, slots=True)
class Walked:
    rows: list[Row]
    next_cursor: str | None
    scanned: int


def has_dimensions(f: DLQFilter | None) -> bool:
    """True when the filter sets a value the index keeps (task, reason, error class, fingerprint)."""
    return f is not None and any(v is not None for v in (f.task, f.reason, f.error_class, f.fingerprint))


def group_id(wanted: str) -> str:
    """A ``fingerprint`` filter's group id: the id itself, or the id of a fingerprint's text."""
    return wanted if _FINGERPRINT_ID.fullmatch(wanted) else fingerprint_id(wanted)


class DLQIndex:
    """One queue's DLQ index, on a sync client returning bytes."""

    def __init__(self, client: Client, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.keys = QueueKeys.for_queue(queue)
        self.ix = IndexKeys.for_queue(self.keys)
        self.sets = IndexSets(client, self.keys)
        self._scripts: Scripts | None = None

    @property
    def scripts(self) -> Scripts:
        if self._scripts is None:
            self._scripts = Scripts(self.client)
        return self._scripts

    # --- state and rebuild ------------------------------------------------------------------------

    def add_state_reads(self, pipe: Any) -> None:
        """Queue the three reads ``parse_state`` needs on a pipeline."""
        pipe.hmget(self.ix.version, "version", "cursor")
        pipe.xlen(self.keys.dlq)
        pipe.hget(self.ix.counts, "all")

    @staticmethod
    def parse_state(replies: list[Any]) -> IndexState:
        (version, cursor), length, indexed = replies
        return IndexState(version.decode() if version else None, cursor is not None, int(indexed or 0),
                          int(length))

    def state(self) -> IndexState:
        pipe = self.client.pipeline(transaction=False)
        self.add_state_reads(pipe)
        return self.parse_state(pipe.execute())

    def advance(self, budget_s: float = READ_BUDGET_S) -> IndexState:
        """Move a rebuild on for about ``budget_s`` seconds when the index is not ready; its state after.

        A missing index, one of another version, or one that counts more
        entries than the stream holds is dropped and built again from the
        first entry; one that counts fewer gets a pass over the stream that
        adds what it lacks. Any number of callers may do this at once: a chunk
        is indexed by the one whose call finds the cursor where it read it.
        """
        st = self.state()
        if st.ready:
            return st
        deadline = time.monotonic() + budget_s
        if st.version != INDEX_VERSION or st.indexed > st.length:
            self.scripts.dlq_reindex(keys=[self.keys.dlq], args=["reset", INDEX_VERSION])
        elif not st.rebuilding:
            self.scripts.dlq_reindex(keys=[self.keys.dlq], args=["start", INDEX_VERSION])
        while True:
            if not self._chunk():
                st = self.state()
                if st.ready or time.monotonic() >= deadline:
                    return st
                # the pass ended short (entries written meanwhile without the index): another one
                self.scripts.dlq_reindex(keys=[self.keys.dlq], args=["start", INDEX_VERSION])
            elif time.monotonic() >= deadline:
                return self.state()

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> IndexState:
        """Rebuild until the index is ready (``manage.py chasqui dlq reindex``); ``progress(indexed, length)``."""
        while True:
            st = self.advance(1.0)
            if progress is not None:
                progress(st.indexed, st.length)
            if st.ready:
                return st

    def _chunk(self) -> bool:
        """Index the next chunk of the pass; False when no pass is under way any more."""
        cursor = self.client.hget(self.ix.version, "cursor")
        if cursor is None:
            return False
        start = cursor.decode()
        rows = self.client.xrange(self.keys.dlq, "-" if start == "0-0" else "(" + start, "+", count=REBUILD_CHUNK)
        args: list[Any] = ["chunk", start, rows[-1][0] if len(rows) == REBUILD_CHUNK else ""]
        for eid, flds in self._unindexed(rows):
            error_class, error = field_text(flds, b"error_class"), field_text(flds, b"error")
            fp, text = error_group(error_class, error)
            if b"fp" in flds:  # written with its group: only the text is wanted, for the group's title
                args += (eid, "", text, "", "")
                continue
            task, job_id = field_text(flds, b"task"), field_text(flds, b"job_id")
            if not task or not job_id:  # written without them: they are in the envelope
                dead = decode_entry(self.queue, eid, flds)
                task, job_id = dead.task, dead.job_id
            args += (eid, fp, text, task, job_id)
        self.scripts.dlq_reindex(keys=[self.keys.dlq], args=args)
        return True

    def _unindexed(self, rows: list[Row]) -> list[Row]:
        """The rows the index lacks (an indexed entry is in its reason's set): a pass over an index that
        lacks a few entries reads the stream but computes and sends only those."""
        by_reason: dict[bytes, list[int]] = {}
        for i, (_, flds) in enumerate(rows):
            by_reason.setdefault(flds.get(b"reason", b""), []).append(i)
        pipe = self.client.pipeline(transaction=False)
        for reason, positions in by_reason.items():
            pipe.zmscore(self.ix.reason(reason.decode("utf-8", "replace")), [rows[i][0] for i in positions])
        missing: list[int] = []
        for positions, scores in zip(by_reason.values(), pipe.execute(), strict=True):
            missing += [i for i, score in zip(positions, scores, strict=True) if score is None]
        return [rows[i] for i in sorted(missing)]

    # --- reads --------------------------------------------------------------------------------------

    def counts(self) -> dict[str, dict[str, int]]:
        """Entries per task, reason and error class (``{"task": {...}, ...}``), and ``{"all": {"": n}}``."""
        out: dict[str, dict[str, int]] = {"all": {}, "task": {}, "reason": {}, "error_class": {}}
        names = {"t": "task", "r": "reason", "c": "error_class"}
        for raw, value in self.client.hgetall(self.ix.counts).items():
            field = raw.decode("utf-8", "replace")
            if field == "all":
                out["all"][""] = int(value)
                continue
            kind, _, name = field.partition(":")
            if kind in names:
                out[names[kind]][name] = int(value)
        return out

    def find_job(self, job_id: str) -> str | None:
        """The entry id of the job's newest dead-letter entry, or None."""
        found = self.client.hget(self.ix.jobs, job_id)
        return found.decode() if found is not None else None

    def dimensions(self, f: DLQFilter) -> list[tuple[list[str], int]]:
        """Each value the filter sets, as the sorted sets that hold its entries and how many they hold."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.ix.counts)
        if f.fingerprint is not None:
            pipe.zscore(self.ix.groups, group_id(f.fingerprint))
        if f.error_class is not None:
            pipe.hgetall(self.ix.group_classes)
        replies = pipe.execute()
        counts = {k.decode("utf-8", "replace"): int(v) for k, v in replies[0].items()}
        dims: list[tuple[list[str], int]] = []
        if f.task is not None:
            dims.append(([self.ix.task(f.task)], counts.get("t:" + f.task, 0)))
        if f.reason is not None:
            dims.append(([self.ix.reason(f.reason)], counts.get("r:" + f.reason, 0)))
        if f.error_class is not None:
            wanted = f.error_class
            classes = {name[2:] for name in counts if name.startswith("c:")
                       and (name[2:] == wanted or name[2:].rpartition(".")[2] == wanted)}
            groups = [fp.decode() for fp, cls in replies[-1].items() if cls.decode("utf-8", "replace") in classes]
            dims.append(([self.ix.group(fp) for fp in sorted(groups)], sum(counts["c:" + c] for c in classes)))
        if f.fingerprint is not None:
            fp = group_id(f.fingerprint)
            dims.append(([self.ix.group(fp)], int(replies[1] or 0)))
        return dims

    def count(self, f: DLQFilter) -> int:
        """Entries matching a filter without ``error_text``, from the counts (one value) or a walk (several)."""
        dims = self.dimensions(f)
        if any(size == 0 for _, size in dims):
            return 0
        lo, hi = _ms_range(f)
        if len(dims) == 1:
            keys, size = dims[0]
            if lo is None and hi is None:
                return size
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.zcount(key, low_bound(lo), high_bound(hi))
            return sum(int(n) for n in pipe.execute())
        dims.sort(key=lambda d: d[1])
        return sum(len(self.sets.intersect(batch, dims[1:])) for batch in self.sets.walk(dims[0][0], None, lo, hi,
                                                                                 WALK_CHUNK * 5))

    def count_range(self, since_ms: int | None, until_ms: int | None) -> int:
        """Entries that died in a time range: every entry is in the set of its reason, so ZCOUNT each."""
        lo, hi = _ms_range(DLQFilter(since_ms=since_ms, until_ms=until_ms))
        reasons = [field[2:].decode("utf-8", "replace") for field in self.client.hkeys(self.ix.counts)
                   if field.startswith(b"r:")]
        pipe = self.client.pipeline(transaction=False)
        for reason in reasons:
            pipe.zcount(self.ix.reason(reason), low_bound(lo), high_bound(hi))
        return sum(int(n) for n in pipe.execute())

    def page(self, f: DLQFilter, *, cursor: str | None, limit: int, scan_limit: int,
             check: Callable[[Row], bool] | None = None) -> Walked:
        """Up to ``limit`` matching rows, newest first, after ``cursor``.

        The walk follows the smallest of the filter's sets and reads at most
        ``scan_limit`` of its ids; ``check`` decides what the index cannot
        (a text filter) on the rows read. Only the rows of the page are read
        when the index decides alone.
        """
        dims = self.dimensions(f)
        if any(size == 0 for _, size in dims):
            return Walked([], None, 0)
        dims.sort(key=lambda d: d[1])
        lo, hi = _ms_range(f)
        start = _position(cursor) if cursor else None
        rows: list[Row] = []
        scanned = 0
        chunk = limit + 1 if len(dims) == 1 and check is None else WALK_CHUNK
        for batch in self.sets.walk(dims[0][0], start, lo, hi, chunk):
            kept = self.sets.intersect(batch, dims[1:])
            i = 0
            while i < len(kept):
                need = limit - len(rows)
                if need == 0 and check is None:  # one more match: the next page starts after the last row
                    return Walked(rows, rows[-1][0].decode(), scanned + len(batch))
                take = kept[i:i + (max(need, 1) if check is None else max(need, 50))]
                for row in self.sets.rows([eid for _, eid in take]):
                    if row is None or (check is not None and not check(row)):
                        continue
                    if len(rows) == limit:
                        return Walked(rows, rows[-1][0].decode(), scanned + len(batch))
                    rows.append(row)
                i += len(take)
            scanned += len(batch)
            if scanned >= scan_limit:
                return Walked(rows, batch[-1][1].decode(), scanned)
        return Walked(rows, None, scanned)

    def groups(self, *, limit: int = 200, since_ms: int | None = None, until_ms: int | None = None) -> Groups:
        """The ``limit`` biggest fingerprints with their counts, seen times, sample and tasks.

        With a time range, counts and times are those of the range (tasks are
        the group's whole list).
        """
        ranged = since_ms is not None or until_ms is not None
        pipe = self.client.pipeline(transaction=False)
        pipe.zrevrange(self.ix.groups, 0, -1 if ranged else limit - 1, withscores=True)
        pipe.zcard(self.ix.groups)
        pipe.hget(self.ix.counts, "all")
        top, total_groups, indexed = pipe.execute()
        lo_ms, hi_ms = _ms_range(DLQFilter(since_ms=since_ms, until_ms=until_ms))
        lo, hi = low_bound(lo_ms), high_bound(hi_ms)
        ids = [raw.decode() for raw, _ in top]
        pipe = self.client.pipeline(transaction=False)
        for fp in ids:
            key = self.ix.group(fp)
            if ranged:
                pipe.zcount(key, lo, hi)
                pipe.zrangebyscore(key, lo, hi, start=0, num=1, withscores=True)
                pipe.zrevrangebyscore(key, hi, lo, start=0, num=1, withscores=True)
            else:
                pipe.zrange(key, 0, 0, withscores=True)
                pipe.zrevrange(key, 0, 0, withscores=True)
            pipe.hget(self.ix.texts, fp)
            pipe.hgetall(self.ix.group_tasks(fp))
        replies = pipe.execute()
        out: list[Group] = []
        step = 5 if ranged else 4
        for i, (fp, (_, score)) in enumerate(zip(ids, top, strict=True)):
            part = replies[i * step:(i + 1) * step]
            count = int(part[0]) if ranged else int(score)
            first, last, text, tasks = part[-4:]
            if not count or not first or not last:
                continue
            out.append(Group(fp, (text or b"").decode("utf-8", "replace"), count, int(first[0][1]) // SEQ_SLOTS,
                             int(last[0][1]) // SEQ_SLOTS, last[0][0].decode(),
                             sorted(t.decode("utf-8", "replace") for t, n in tasks.items() if int(n) > 0)))
        out.sort(key=lambda g: (-g.count, -g.last_seen_ms))
        if ranged:
            return Groups(out[:limit], len(out), sum(g.count for g in out[limit:]))
        shown = sum(g.count for g in out)
        return Groups(out, int(total_groups), max(0, int(indexed or 0) - shown))

    # --- walking --------------------------------------------------------------------------------------

    def oldest_first(self, f: DLQFilter, start: StreamId | None, hi: StreamId | None,
                     chunk: int) -> Iterator[tuple[list[bytes], StreamId]]:
        """The ids the filter's indexed values match, oldest first, from ``start`` (inclusive) to ``hi``.

        What a bulk replay or discard acts on: only the ids of the smallest
        of the filter's sets are read (and checked against the others), never
        an entry, so a filter matching 7 entries of a million reads 7 ids.
        Each step yields the ids kept and the last id it walked (the next
        step starts after it, whether or not that id was kept); entries the
        caller removes meanwhile do not disturb the walk. The time range and
        text of ``f`` are the caller's to apply beyond ``start`` and ``hi``.
        """
        dims = self.dimensions(f)
        if not dims or any(size == 0 for _, size in dims):
            return
        dims.sort(key=lambda d: d[1])
        lo = _ms_range(f)[0]
        top = score_of(hi) if hi is not None else None
        if start is not None and (lo is None or score_of(start) > lo):
            lo = None
        else:
            start = None
        for walked in self.sets.ascend(dims[0][0], start, lo, top, chunk):
            kept = self.sets.intersect(walked, dims[1:])
            yield [eid for _, eid in kept], id_of(walked[-1][1])


def _ms_range(f: DLQFilter) -> tuple[int | None, int | None]:
    """The filter's time range as inclusive scores (``until_ms`` is exclusive in the filter)."""
    return (f.since_ms * SEQ_SLOTS if f.since_ms is not None else None,
            f.until_ms * SEQ_SLOTS - 1 if f.until_ms is not None else None)


def _position(cursor: str) -> Position:
    sid = parse_id(cursor, "cursor")
    return score_of(sid), format_id(sid).encode()
