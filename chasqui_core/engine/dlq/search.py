"""Free-text search over a whole DLQ, newest first, a chunk per read.

Each chunk of entries is read as the raw bytes Redis sends
(``store/raw_reply.py``), and the needle (ASCII letters without case) and
the ids of the shared tracebacks that hold it are looked for in those bytes
with one find each, in C. Most chunks hold neither and are done with: no
entry is parsed, and Redis does no more than the read. A chunk that holds a
hit is parsed, and its entries are candidates where the needle is in the
job's envelope (which holds its id, task, arguments and error history) or
its last error's class or message, or where the envelope names one of those
tracebacks. Each candidate is then checked against the text an operator may
see (arguments and messages with secrets masked): a value that is masked
when shown is never found, so a search cannot be used to guess a secret.

A search stops when it has a page of matches, has read ``scan_limit``
entries, or has run ``time_limit`` seconds; ``next_cursor`` then says where
to go on, so a console can show a live list that grows call by call, with
its progress (``scanned`` of ``total``), and stop whenever the operator
wants.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from chasqui_core.engine.jobs import redact
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.raw_reply import RawReplies, parse, stream_range_tail
from chasqui_core.engine.dlq.browse import check_positive
from chasqui_core.engine.dlq.entries import DeadJob, decode_entry, format_id, id_of, parse_id
from chasqui_core.engine.dlq.index import IndexKeys
from chasqui_core.engine.dlq.shared import resolve, text_ids_holding

CHUNK = 2000
"""Entries one read returns: about a megabyte, a few milliseconds of Redis time; the round trip is a small part
of a read, and other clients wait no longer than that behind it."""
MAX_NEEDLE = 200
_ENTRY_TEXT = (b"j", b"error", b"error_class")
"""The fields a candidate holds the needle in (the envelope and the last error; the other fields repeat what the
envelope holds, or are not text an operator searches)."""


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
    """Substring search over one queue's DLQ, on a sync redis-py client."""

    def __init__(self, client: Client, queue: str, *, masked_keys: Iterable[str] | None = None) -> None:
        self.client = client
        self.queue = queue
        self.keys = QueueKeys.for_queue(queue)
        self.masked_keys = tuple(masked_keys) if masked_keys is not None else None
        self._raw = RawReplies(client, self.keys.dlq)

    def _ask(self, start: str, count: int) -> bytes:
        """Send for up to ``count`` entries from ``start`` (inclusive, newest first), and one more: where the next
        read starts."""
        return self._raw.send(b"XREVRANGE", self.keys.dlq.encode(), start.encode(), b"-", b"COUNT",
                              b"%d" % (count + 1))

    def _answer(self, asked: bytes, start: str, count: int) -> bytes | list[Any]:
        """The reply ``_ask`` sent for, raw; on a cluster moving the queue's slot, the rows (id, fields) read
        again through redis-py, which follows the redirection."""
        try:
            return self._raw.receive(asked)
        except redis.ResponseError as exc:
            if not str(exc).startswith(("MOVED", "ASK")):
                raise
            return [[eid, [v for pair in fields.items() for v in pair]]
                    for eid, fields in self.client.xrevrange(self.keys.dlq, start, "-", count + 1)]

    def _extent(self, reply: bytes | list[Any], count: int) -> tuple[int, str]:
        """How many entries a reply holds of the ``count`` asked for, and where the next read starts ('' when the
        oldest entry was read): from the end of a raw reply, without parsing the entries before it."""
        if isinstance(reply, list):
            return min(len(reply), count), reply[count][0].decode() if len(reply) > count else ""
        dlq = self.keys.dlq.encode()
        size, last = stream_range_tail(reply, lambda eid, entry: self._raw.holds_entry(dlq, eid, entry))
        if size <= count or last is None:
            return size, ""
        return count, last.decode()

    @staticmethod
    def _candidates(reply: bytes | list[Any], count: int, pattern: bytes, named: list[bytes]) -> Iterator[Any]:
        """The rows (id, fields) of the entries read that hold the needle where a search looks, in order, looked at
        as they are taken (a page may need a few of a chunk's thousands): a raw reply is parsed only when its bytes
        hold the needle somewhere."""
        if isinstance(reply, list):
            rows = reply
        elif pattern in reply.lower() or any(name in reply for name in named):
            rows = parse(reply)
        else:
            return iter(())
        return (row for row in itertools.islice(rows, count) if _candidate(row[1], pattern, named))

    def _matching(self, rows: list[Any], folded: str) -> Iterator[DeadJob]:
        """The entries of ``rows`` whose visible (masked) text holds ``folded``, in order."""
        decoded = [decode_entry(self.queue, eid, dict(zip(fields[::2], fields[1::2], strict=False)))
                   for eid, fields in rows]
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
        start = format_id(parse_id(cursor, "cursor")) if cursor else "+"
        folded = needle.casefold()
        pattern = needle.encode().lower()  # ASCII letters only: what bytes.lower() folds
        total = int(self.client.xlen(self.keys.dlq))
        named = [name.encode() for name in text_ids_holding(
            self.client, self.keys.dlq, IndexKeys.for_queue(self.keys).groups, folded,
            lambda t: redact.mask_text(t, self.masked_keys))]
        items: list[DeadJob] = []
        scanned = 0
        began = time.monotonic()
        want = min(chunk, scan_limit)
        with self._raw.held():
            asked: bytes | None = self._ask(start, want)
            while True:
                assert asked is not None  # sent for before each turn
                reply = self._answer(asked, start, want)
                read, nxt = self._extent(reply, want)
                asked = None
                if nxt and scanned + read < scan_limit and time.monotonic() - began < time_limit:
                    # the next chunk on its way while this one is searched (it is read and dropped should this
                    # one fill the page)
                    start, want = nxt, min(chunk, scan_limit - scanned - read)
                    asked = self._ask(start, want)
                candidates = self._candidates(reply, read, pattern, named)
                size = 0
                while True:
                    # decode as many as the page may still take (a common word makes every entry a candidate),
                    # twice as many each time a mask hid some: a few rounds a chunk, however many it hides
                    size = max(limit + 1 - len(items), 2 * size)
                    batch = list(itertools.islice(candidates, size))
                    if not batch:
                        break
                    for dead in self._matching(batch, folded):
                        if len(items) == limit:  # one more match: the next page starts here
                            return SearchPage(items, format_id(id_of(dead.entry_id)), scanned + read, total)
                        items.append(dead)
                scanned += read
                if not nxt:
                    return SearchPage(items, None, scanned, total)
                if len(items) == limit:  # the rest of this chunk was read and held no other match
                    return SearchPage(items, nxt, scanned, total)
                if asked is None:  # the scan or time limit, as it stood when this chunk came in
                    return SearchPage(items, nxt, scanned, total)


def _candidate(fields: list[bytes], pattern: bytes, named: list[bytes]) -> bool:
    """Whether an entry's fields (name, value, ...) hold the needle where a search looks (``_ENTRY_TEXT``), or its
    envelope names a shared traceback that holds it."""
    for k in range(0, len(fields) - 1, 2):
        name = fields[k]
        if name in _ENTRY_TEXT:
            value = fields[k + 1]
            if pattern in value.lower() or name == b"j" and any(n in value for n in named):
                return True
    return False
