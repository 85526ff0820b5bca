"""Free-text search over a whole DLQ, newest first, a chunk per call.

``dlq_search.lua`` reads a chunk of entries inside Redis and returns only
the ids of those whose raw text holds the needle, so a scan costs one round
trip per ``CHUNK`` entries and ships almost nothing back. Each candidate is
then checked here against the text an operator may see (arguments and
messages with secrets masked): a value that is masked when shown is never
found, so a search cannot be used to guess a secret.

A search stops when it has a page of matches, has read ``scan_limit``
entries, or has run ``time_limit`` seconds; ``next_cursor`` then says where
to go on, so a console can show a live list that grows call by call, with
its progress (``scanned`` of ``total``), and stop whenever the operator
wants.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.jobs import redact
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.dlq.browse import check_positive
from chasqui_core.engine.dlq.entries import DeadJob, decode_entry, format_id, id_of, parse_id
from chasqui_core.engine.dlq.index import IndexKeys
from chasqui_core.engine.dlq.shared import resolve, text_ids_holding

CHUNK = 2000
"""Entries one script call reads: about 7 ms of Redis time on a small host (3.5 µs an entry).

Long enough that the round trip is a percent of a call, short enough that
other clients wait no more than a few milliseconds behind it.
"""
STEP = 250
"""Entries per XREVRANGE inside a call: small reads stay in the CPU's cache (see dlq_search.lua)."""
MAX_NEEDLE = 200

_RARITY = {c: i for i, c in enumerate(b"etaoinsrhldcumfpgwybvkxjqz")}
"""ASCII letters, most common first (in English text, as in error messages and tracebacks)."""
_COMMON = frozenset(b" ./_-'\"\n:,()")


def _rarity(byte: int) -> int:
    if byte in _RARITY:
        return _RARITY[byte]
    if byte in _COMMON:
        return -1
    return 22 if 48 <= byte <= 57 else 20  # a given digit is rarer than most letters


def anchor(needle: bytes) -> int:
    """The 1-based position of the byte of ``needle`` the scan looks for first: the rarest one."""
    return max(range(len(needle)), key=lambda i: (_rarity(needle[i]), -i)) + 1


@dataclass(frozen=True, slots=True)
class SearchPage:
    items: list[DeadJob]
    next_cursor: str | None
    """Pass back as ``cursor`` to go on (older entries); None when the whole DLQ was read."""
    scanned: int
    """Entries read by this call."""
    total: int
    """Entries in the DLQ when this call started (for a progress figure)."""


def _texts(value: Any) -> Iterator[str]:
    """Every piece of text an operator sees of a (masked) value: strings, keys and plain values."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _texts(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _texts(v)
    elif value is not None:
        yield str(value)


def visible_texts(dead: DeadJob, keys: Iterable[str] | None = None) -> Iterator[str]:
    """What a search may match in an entry: its ids, task, errors and arguments, secrets masked."""
    keys = tuple(keys) if keys is not None else None
    yield dead.entry_id
    yield dead.job_id
    yield dead.task
    yield dead.error_class
    yield redact.mask_text(dead.error, keys)
    for record in dead.errors:
        if isinstance(record, dict):
            yield str(record.get("class", ""))
            yield redact.mask_text(str(record.get("message", "")), keys)
            yield redact.mask_text(str(record.get("traceback", "")), keys)
    if dead.job is not None:
        yield from _texts(redact.mask(dead.job.args, keys))
        yield from _texts(redact.mask(dead.job.kwargs, keys))


class TextSearch:
    """Substring search over one queue's DLQ, on a sync redis-py client that returns bytes."""

    def __init__(self, client: Client, queue: str, *, masked_keys: Iterable[str] | None = None) -> None:
        self.client = client
        self.queue = queue
        self.keys = QueueKeys.for_queue(queue)
        self.scripts = Scripts(client)
        self.masked_keys = tuple(masked_keys) if masked_keys is not None else None

    def _matching(self, ids: list[bytes], folded: str) -> Iterator[DeadJob]:
        """The entries of ``ids`` still in the DLQ whose visible (masked) text holds ``folded``, in order."""
        pipe = self.client.pipeline(transaction=False)
        for eid in ids:
            pipe.xrange(self.keys.dlq, eid, eid, count=1)
        rows = [found[0] for found in pipe.execute() if found]  # the others were replayed or discarded since
        decoded = [decode_entry(self.queue, *row) for row in rows]
        resolve(self.client, self.keys.dlq, decoded)
        for dead in decoded:
            if any(folded in t.casefold() for t in visible_texts(dead, self.masked_keys)):
                yield dead

    def search(
        self,
        text: str,
        *,
        cursor: str | None = None,
        limit: int = 50,
        scan_limit: int = 1_000_000,
        time_limit: float = 0.5,
        chunk: int = CHUNK,
        step: int = STEP,
    ) -> SearchPage:
        """Up to ``limit`` entries holding ``text`` (case-insensitive), newest first, older than ``cursor``."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("Type some text to search for")
        needle = text.strip()
        if len(needle) > MAX_NEEDLE:
            raise ValueError(f"The search text is too long ({len(needle)} characters): use at most {MAX_NEEDLE}")
        check_positive(limit, "limit")
        check_positive(scan_limit, "scan_limit")
        check_positive(chunk, "chunk")
        check_positive(step, "step")
        start = format_id(parse_id(cursor, "cursor")) if cursor else "+"
        folded = needle.casefold()
        pattern = needle.encode().lower()  # ASCII letters only, as Lua's string.lower does
        at = anchor(pattern)
        total = int(self.client.xlen(self.keys.dlq))
        named = text_ids_holding(self.client, self.keys.dlq, IndexKeys.for_queue(self.keys).groups, folded,
                                 lambda t: redact.mask_text(t, self.masked_keys))
        items: list[DeadJob] = []
        scanned = 0
        began = time.monotonic()
        while True:
            reply = self.scripts.dlq_search(
                keys=[self.keys.dlq], args=[start, min(chunk, scan_limit - scanned), pattern, at, step, *named]
            )
            read, nxt, candidates = int(reply[0]), reply[1].decode(), reply[2:]
            size = 0
            while candidates:
                # fetch as many as the page may still take (a common word makes every entry a candidate),
                # twice as many each time a mask hid some: a few round trips a chunk, however many it hides
                size = max(limit + 1 - len(items), 2 * size)
                batch, candidates = candidates[:size], candidates[size:]
                for dead in self._matching(batch, folded):
                    if len(items) == limit:  # one more match: the next page starts here
                        return SearchPage(items, format_id(id_of(dead.entry_id)), scanned + read, total)
                    items.append(dead)
            scanned += read
            if not nxt:
                return SearchPage(items, None, scanned, total)
            if len(items) == limit:  # the rest of this chunk was read and held no other match
                return SearchPage(items, nxt, scanned, total)
            if scanned >= scan_limit or time.monotonic() - began >= time_limit:
                return SearchPage(items, nxt, scanned, total)
            start = nxt
