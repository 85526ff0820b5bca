"""The dead-letter queue as operators use it: browse, search, replay, discard.

A queue's DLQ is a Redis stream whose entry ids carry the time each job died,
so a time range is an id range and a page is one XREVRANGE call, quick at any
size. Filters on other fields scan in bounded chunks, and the bulk operations
act one chunk per call, so sweeping 100,000 entries never blocks Redis for
long and an operator can stop a sweep half way (what is done stays done).

Replays go through ``dlq_move.lua``, which deletes each entry and re-publishes
it in one step: two operators replaying the same entries at once publish each
job once.

The client must return bytes (``decode_responses=False``), as the engine's
``connect()`` does: payloads are msgpack.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .envelope import DecodeError, Job, decode
from .errors import JobNotFound
from .keys import QueueKeys
from .redact import mask_text
from .scripts import Scripts

REASONS = ("retries_exhausted", "unrecoverable", "panic", "decode_failed", "unknown_task", "oversize")
"""Why a job was dead-lettered (the ``reason`` field of every DLQ entry)."""

SCAN_CHUNK = 500
"""Entries read per round trip when scanning; bounds each call's work and memory."""

MOVE_CHUNK = 500
"""Entries replayed or deleted per call when acting on a list of ids."""

_MAX_PART = 2**64 - 1
_ENTRY_ID = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_WORKER_LOST = "WorkerLost"

StreamId = tuple[int, int]


# --- entry ids ------------------------------------------------------------------


def _parse_id(value: object, what: str = "entry id") -> StreamId:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    m = _ENTRY_ID.match(value) if isinstance(value, str) else None
    if m is None or int(m[1]) > _MAX_PART or int(m[2]) > _MAX_PART:
        raise ValueError(
            f"{value!r} is not a valid dead-letter {what}: expected '<milliseconds>-<sequence>', "
            f"for example '1700000000000-0'"
        )
    return int(m[1]), int(m[2])


def _fmt(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def _before(sid: StreamId) -> StreamId | None:
    """The greatest id below ``sid`` (turns an exclusive bound into an inclusive one)."""
    ms, seq = sid
    if seq:
        return ms, seq - 1
    return (ms - 1, _MAX_PART) if ms else None


def _after(sid: StreamId) -> StreamId | None:
    ms, seq = sid
    if seq < _MAX_PART:
        return ms, seq + 1
    return (ms + 1, 0) if ms < _MAX_PART else None


def _sid(raw: bytes | str) -> StreamId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _id_list(entry_ids: Iterable[str], caller: str) -> list[str]:
    """Validate every id before touching anything; drop repeats, keep order."""
    if isinstance(entry_ids, (str, bytes)):
        raise TypeError(f"{caller}() takes a list of entry ids; wrap a single id in a list: {caller}([id])")
    out: dict[str, None] = {}
    for eid in entry_ids:
        out[_fmt(_parse_id(eid))] = None
    return list(out)


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of 1 or more, got {value!r}")
    return value


# --- fingerprints -----------------------------------------------------------------

_NORMALISERS = (
    (re.compile(r"""(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)"[^"\n]*"(?!\w)|`[^`\n]*`"""), "<str>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b"), "<id>"),  # ULIDs, as used for job ids
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{6,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)
_FINGERPRINT_TEXT = 200


def fingerprint(error_class: str, message: str) -> str:
    """Error class plus the message with its variable parts replaced.

    Failures that differ only in ids, numbers or quoted values ("user 123 not
    found", "user 456 not found") share a fingerprint, so one group shows
    one cause. Long messages are cut, with a digest of the whole normalised
    text appended so that two long messages differing at the end stay apart.
    """
    text = mask_text(message)  # before normalising: "password=x9TopSecret" must not leave "TopSecret"
    for pattern, placeholder in _NORMALISERS:
        text = pattern.sub(placeholder, text)
    text = text.strip()
    if len(text) > _FINGERPRINT_TEXT:
        digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
        text = f"{text[:_FINGERPRINT_TEXT]}…#{digest}"
    if error_class and text:
        return f"{error_class}: {text}"
    return error_class or text


_FINGERPRINT_ID = re.compile(r"[0-9a-f]{16}")


def fingerprint_id(fingerprint_text: str) -> str:
    """A short, stable id for a fingerprint: what URLs and filters carry instead of its text."""
    return hashlib.blake2b(fingerprint_text.encode(), digest_size=8).hexdigest()


def _fingerprint_matches(wanted: str, actual: str) -> bool:
    """``wanted`` is a fingerprint id (as groups give it) or, for scripts written earlier, its text."""
    if _FINGERPRINT_ID.fullmatch(wanted):
        return fingerprint_id(actual) == wanted
    return actual == wanted


def _class_matches(wanted: str, actual: str) -> bool:
    return actual == wanted or actual.rpartition(".")[2] == wanted


# --- value objects ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadJob:
    """One DLQ entry with its job decoded (``job`` is None when the payload cannot be)."""

    entry_id: str
    queue: str
    reason: str
    job_id: str
    task: str
    source_id: str
    """The stream entry id the job had when it died."""
    error_class: str
    error: str
    """The last error message."""
    dead_at_ms: int
    job: Job | None
    payload: bytes
    errors: list[dict[str, Any]]
    """The envelope's error history; a panic gets a ``WorkerLost`` record at the end (see ``_synthesised``)."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.error_class, self.error)

    @property
    def fingerprint_id(self) -> str:
        return fingerprint_id(self.fingerprint)

    @property
    def replayable(self) -> bool:
        """False when the payload cannot be decoded, so there is no job to send back."""
        return self.job is not None


@dataclass(frozen=True, slots=True)
class Page:
    items: list[DeadJob]
    next_cursor: str | None
    """Pass back as ``cursor`` for the next (older) page; None when nothing older can match."""
    scanned: int
    """Entries read to fill this page (more than ``len(items)`` when filtering)."""


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    fingerprint: str
    error_class: str
    sample_message: str
    """The last error message of the newest entry in the group."""
    count: int
    first_seen_ms: int
    last_seen_ms: int
    sample_entry_id: str
    tasks: list[str]

    @property
    def id(self) -> str:
        """The fingerprint's id: pass it as a filter's ``fingerprint`` to act on this group."""
        return fingerprint_id(self.fingerprint)


_FILTER_FIELDS = ("task", "reason", "error_class", "error_text", "fingerprint", "since_ms", "until_ms")


@dataclass(frozen=True, slots=True)
class DLQFilter:
    """Which dead jobs to show or act on; unset fields match everything.

    Empty or blank strings count as unset, so a filter built straight from a
    form or a query string means what the operator typed.
    """

    task: str | None = None
    """Exact task name."""
    reason: str | None = None
    """One of REASONS."""
    error_class: str | None = None
    """Exact class name, or its last dotted part ("ValueError" matches "builtins.ValueError")."""
    error_text: str | None = None
    """Case-insensitive text found in the last error message or any message of the history."""
    fingerprint: str | None = None
    """One group of the "group by error" view: its id (``ErrorGroup.id``), or the fingerprint's exact text."""
    since_ms: int | None = None
    """Died at or after this time (epoch ms)."""
    until_ms: int | None = None
    """Died before this time (epoch ms)."""

    def __post_init__(self) -> None:
        for name in ("task", "reason", "error_class", "error_text", "fingerprint"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise TypeError(f"DLQ filter {name} must be text, got {type(value).__name__}")
            if not value.strip():
                object.__setattr__(self, name, None)
            elif name not in ("error_text", "fingerprint"):
                object.__setattr__(self, name, value.strip())
        if self.reason is not None and self.reason not in REASONS:
            raise ValueError(f"Unknown dead-letter reason {self.reason!r}: use one of {', '.join(REASONS)}")
        for name in ("since_ms", "until_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"DLQ filter {name} must be a time in epoch milliseconds (0 or more), got {value!r}")
        if self.since_ms is not None and self.until_ms is not None and self.since_ms > self.until_ms:
            raise ValueError(
                f"The time range is empty: since_ms ({self.since_ms}) is after until_ms ({self.until_ms})"
            )

    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in _FILTER_FIELDS)

    def _time_only(self) -> bool:
        return (self.task is None and self.reason is None and self.error_class is None and self.error_text is None
                and self.fingerprint is None)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FILTER_FIELDS if getattr(self, name) is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DLQFilter:
        """Build a filter from ``to_dict`` output or query parameters (times may be digit strings)."""
        if not isinstance(d, Mapping):
            raise TypeError(f"A DLQ filter must be built from a mapping, got {type(d).__name__}")
        unknown = [key for key in d if key not in _FILTER_FIELDS]
        if unknown:
            raise ValueError(
                f"Unknown DLQ filter field(s) {', '.join(map(repr, unknown))}; "
                f"known fields are {', '.join(_FILTER_FIELDS)}"
            )
        values = dict(d)
        for name in ("since_ms", "until_ms"):
            value = values.get(name)
            if isinstance(value, str):
                text = value.strip()
                if not text:
                    values[name] = None
                elif text.isdigit():
                    values[name] = int(text)
                else:
                    raise ValueError(f"DLQ filter {name} must be a time in epoch milliseconds, got {value!r}")
        return cls(**values)

    def matches(self, job: DeadJob) -> bool:
        if self.since_ms is not None and job.dead_at_ms < self.since_ms:
            return False
        if self.until_ms is not None and job.dead_at_ms >= self.until_ms:
            return False
        if self.reason is not None and job.reason != self.reason:
            return False
        if self.task is not None and job.task != self.task:
            return False
        if self.error_class is not None and not _class_matches(self.error_class, job.error_class):
            return False
        if self.fingerprint is not None and not _fingerprint_matches(self.fingerprint, job.fingerprint):
            return False
        if self.error_text is not None:
            needle = self.error_text.casefold()
            if needle not in job.error.casefold() and not any(
                needle in str(record.get("message", "")).casefold()
                for record in job.errors if isinstance(record, dict)
            ):
                return False
        return True

    def _precheck(self, dead_at_ms: int, fields: dict[bytes, bytes]) -> bool | None:
        """Match on the entry's plain fields: True or False when they decide, None when the envelope must.

        Most filters are decided here, which spares decoding the payload of
        every entry a scan passes over.
        """
        if self.since_ms is not None and dead_at_ms < self.since_ms:
            return False
        if self.until_ms is not None and dead_at_ms >= self.until_ms:
            return False
        if self.reason is not None and _field(fields, b"reason") != self.reason:
            return False
        if self.error_class is not None and not _class_matches(self.error_class, _field(fields, b"error_class")):
            return False
        if self.fingerprint is not None and not _fingerprint_matches(
                self.fingerprint, fingerprint(_field(fields, b"error_class"), _field(fields, b"error"))):
            return False
        undecided = False
        if self.task is not None:
            task = _field(fields, b"task")
            if task and task != self.task:
                return False
            undecided = not task  # written without a task name: it is in the envelope
        if self.error_text is not None and self.error_text.casefold() not in _field(fields, b"error").casefold():
            undecided = True  # may be in the history
        return None if undecided else True


# --- reading entries -------------------------------------------------------------------


def _field(fields: dict[bytes, bytes], name: bytes) -> str:
    value = fields.get(name)
    return value.decode("utf-8", "replace") if value is not None else ""


def _synthesised(job: Job | None, error: str, dead_at_ms: int, deliveries: int | None) -> dict[str, Any]:
    """The history record of a run lost with its worker, which no worker could write.

    ``replays`` tells this death from one before an earlier replay, so a job
    that is replayed and dies again gets a record for each death.
    """
    attempt = None
    if job is not None:
        attempt = job.attempt + (deliveries - 1 if deliveries and deliveries > 1 else 1)
    return {
        "attempt": attempt,
        "class": _WORKER_LOST,
        "message": error,
        "traceback": "",
        "worker": "",
        "started_at": None,
        "finished_at": dead_at_ms,
        "duration_ms": None,
        "deliveries": deliveries,
        "replays": job.replays if job is not None else 0,
        "synthesized": True,
    }


def _dead_job(queue: str, raw_id: bytes | str, fields: dict[bytes, bytes]) -> DeadJob:
    entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
    payload = fields.get(b"j", b"")
    try:
        job: Job | None = decode(payload)
    except DecodeError:
        job = None
    reason = _field(fields, b"reason")
    error = _field(fields, b"error")
    dead_at_ms = _sid(entry_id)[0]
    errors = list(job.errors) if job is not None else []
    if reason == "panic":
        last = errors[-1] if errors and isinstance(errors[-1], dict) else None
        current = job.replays if job is not None else 0
        if last is None or last.get("class") != _WORKER_LOST or last.get("replays", current) != current:
            deliveries = _field(fields, b"deliveries")
            errors.append(_synthesised(job, error, dead_at_ms, int(deliveries) if deliveries.isdigit() else None))
    return DeadJob(
        entry_id=entry_id,
        queue=queue,
        reason=reason,
        job_id=_field(fields, b"job_id") or (job.id if job is not None else ""),
        task=_field(fields, b"task") or (job.task if job is not None else ""),
        source_id=_field(fields, b"source_id"),
        error_class=_field(fields, b"error_class"),
        error=error,
        dead_at_ms=dead_at_ms,
        job=job,
        payload=payload,
        errors=errors,
    )


def _replayed(dead: DeadJob, reset_attempts: bool) -> bytes:
    """The envelope to send back: same id and history, a fresh budget or exactly one more run."""
    job = dead.job
    assert job is not None
    if reset_attempts:
        attempt, max_attempts = 0, job.max_attempts
    else:
        attempt, max_attempts = job.attempt, job.attempt + 1
    return Job(job.id, job.task, job.args, job.kwargs, attempt, job.created_at, max_attempts, job.backoff,
               list(dead.errors), job.replays + 1, job.result_ttl, 0, job.meta).encode()


Row = tuple[bytes, dict[bytes, bytes]]


# --- the DLQ of one queue ---------------------------------------------------------------


class DeadLetters:
    """The dead-letter queue of one queue, on a sync redis-py client."""

    def __init__(self, client, queue: str) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError(
                "DeadLetters needs a Redis client that returns bytes (decode_responses=False): "
                "job payloads are binary; use chasqui_core.engine.connection.connect()"
            )
        self.client = client
        self.queue = queue
        self.keys = QueueKeys.for_queue(queue)
        self._scripts = Scripts(client)

    # --- browsing -----------------------------------------------------------------

    def count(self) -> int:
        return int(self.client.xlen(self.keys.dlq))

    def page(
        self,
        *,
        cursor: str | None = None,
        limit: int = 50,
        filter: DLQFilter | None = None,
        scan_limit: int = 20_000,
    ) -> Page:
        """Newest first, ``limit`` entries older than ``cursor``.

        Without a filter (or with a time range only) this is one XREVRANGE,
        cheap at any DLQ size. Other filters read chunks until ``limit``
        entries match or ``scan_limit`` entries were read; ``next_cursor``
        then lets the caller carry on from where the scan stopped.
        """
        _positive(limit, "limit")
        _positive(scan_limit, "scan_limit")
        f = filter if filter is not None and not filter.is_empty() else None
        bounds = self._bounds(f, cursor)
        if bounds is None:
            return Page([], None, 0)
        lo, hi = bounds
        if f is None or f._time_only():
            rows = self.client.xrevrange(self.keys.dlq, _fmt(hi), _fmt(lo), count=limit + 1)
            more = len(rows) > limit
            items = [_dead_job(self.queue, eid, flds) for eid, flds in rows[:limit]]
            return Page(items, items[-1].entry_id if more else None, len(items))
        items: list[DeadJob] = []
        scanned = 0
        while True:
            want = min(SCAN_CHUNK, scan_limit - scanned)
            rows = self.client.xrevrange(self.keys.dlq, _fmt(hi), _fmt(lo), count=want)
            for eid, flds in rows:
                dead = self._match(f, eid, flds)
                if len(items) == limit:
                    if dead is not None:  # one more match: the next page starts here
                        return Page(items, items[-1].entry_id, scanned)
                elif dead is not None:
                    items.append(dead)
                scanned += 1
            if len(rows) < want:
                return Page(items, None, scanned)
            last = _sid(rows[-1][0])
            nxt = _before(last)
            if nxt is None or nxt < lo:
                return Page(items, None, scanned)
            if scanned >= scan_limit or len(items) == limit:
                return Page(items, _fmt(last), scanned)
            hi = nxt

    def get(self, entry_id: str) -> DeadJob:
        eid = _fmt(_parse_id(entry_id))
        rows = self.client.xrange(self.keys.dlq, eid, eid, count=1)
        if not rows:
            raise JobNotFound(
                f"No dead-letter entry {eid} in queue {self.queue!r}: it was replayed or discarded, "
                f"or the id is wrong"
            )
        return _dead_job(self.queue, *rows[0])

    def find_by_job_id(self, job_id: str, *, scan_limit: int = 100_000) -> DeadJob | None:
        """The newest entry of this job among the newest ``scan_limit`` entries."""
        _positive(scan_limit, "scan_limit")
        wanted = job_id.encode()
        for eid, flds in self._scan_newest(None, scan_limit):
            stored = flds.get(b"job_id")
            if stored:
                if stored == wanted:
                    return _dead_job(self.queue, eid, flds)
            else:
                dead = _dead_job(self.queue, eid, flds)
                if dead.job_id == job_id:
                    return dead
        return None

    def count_matching(self, filter: DLQFilter, *, chunk: int = 1000) -> int:
        _positive(chunk, "chunk")
        f = filter if filter is not None and not filter.is_empty() else None
        if f is None:
            return self.count()
        bounds = self._bounds(f)
        return 0 if bounds is None else self._count_in(f, *bounds, chunk)

    def groups(self, filter: DLQFilter | None = None, *, scan_limit: int = 100_000) -> list[ErrorGroup]:
        """Matching entries among the newest ``scan_limit``, grouped by fingerprint, biggest first."""
        _positive(scan_limit, "scan_limit")
        f = filter if filter is not None and not filter.is_empty() else None
        acc: dict[str, list[Any]] = {}
        for eid, flds in self._scan_newest(f, scan_limit):
            decided = True if f is None else f._precheck(_sid(eid)[0], flds)
            if decided is False:
                continue
            task = _field(flds, b"task")
            if decided is None or not task:
                dead = _dead_job(self.queue, eid, flds)
                if f is not None and not f.matches(dead):
                    continue
                task = dead.task
            error_class, message = _field(flds, b"error_class"), _field(flds, b"error")
            key = fingerprint(error_class, message)
            dead_at = _sid(eid)[0]
            group = acc.get(key)
            if group is None:  # newest first: the first seen is the sample
                acc[key] = [error_class, message, 1, dead_at, dead_at, eid.decode(), {task}]
            else:
                group[2] += 1
                group[3] = min(group[3], dead_at)
                group[4] = max(group[4], dead_at)
                group[6].add(task)
        out = [ErrorGroup(key, g[0], g[1], g[2], g[3], g[4], g[5], sorted(t for t in g[6] if t))
               for key, g in acc.items()]
        out.sort(key=lambda g: (-g.count, -g.last_seen_ms))
        return out

    # --- acting -----------------------------------------------------------------------

    def replay(self, entry_ids: Iterable[str], *, reset_attempts: bool = True, run_at_ms: int | None = None) -> int:
        """Send entries back to the stream (or the delayed set, at ``run_at_ms``).

        Same job id and error history; ``replays`` goes up by one and the lost
        runs count (``deaths``) starts again. ``reset_attempts=True`` gives the
        job its whole budget again; False grants exactly one more run. Entries
        whose payload cannot be decoded stay in the DLQ. Returns how many
        entries this call moved: entries already replayed or discarded by
        someone else are not counted.
        """
        ids = _id_list(entry_ids, "replay")
        _check_run_at(run_at_ms)
        moved = 0
        for chunk in _chunks(ids, MOVE_CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for eid in chunk:
                pipe.xrange(self.keys.dlq, eid, eid, count=1)
            rows = [found[0] for found in pipe.execute() if found]
            moved += self._move([_dead_job(self.queue, eid, flds) for eid, flds in rows], reset_attempts, run_at_ms)
        return moved

    def discard(self, entry_ids: Iterable[str]) -> int:
        """Delete entries for good; returns how many were still there."""
        ids = _id_list(entry_ids, "discard")
        return sum(int(self.client.xdel(self.keys.dlq, *chunk)) for chunk in _chunks(ids, MOVE_CHUNK))

    def replay_matching(
        self,
        filter: DLQFilter,
        *,
        reset_attempts: bool = True,
        run_at_ms: int | None = None,
        chunk: int = 500,
        progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        """``replay`` every entry that matches, oldest first, one call per chunk; see ``_sweep``."""
        _check_run_at(run_at_ms)

        def act(matched: list[tuple[Row, DeadJob | None]]) -> int:
            dead = [d if d is not None else _dead_job(self.queue, *row) for row, d in matched]
            return self._move(dead, reset_attempts, run_at_ms)

        return self._sweep(filter, act, chunk, progress, should_stop)

    def discard_matching(
        self,
        filter: DLQFilter,
        *,
        chunk: int = 500,
        progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        """``discard`` every entry that matches, oldest first, one call per chunk; see ``_sweep``."""

        def act(matched: list[tuple[Row, DeadJob | None]]) -> int:
            return int(self.client.xdel(self.keys.dlq, *[row[0] for row, _ in matched])) if matched else 0

        return self._sweep(filter, act, chunk, progress, should_stop)

    # --- internals ----------------------------------------------------------------------

    def _bounds(self, f: DLQFilter | None, cursor: str | None = None) -> tuple[StreamId, StreamId] | None:
        """The inclusive id range a filter's time range (and a page cursor) allow; None when empty."""
        lo: StreamId = (0, 0)
        hi: StreamId | None = (_MAX_PART, _MAX_PART)
        if f is not None and f.since_ms is not None:
            lo = (f.since_ms, 0)
        if f is not None and f.until_ms is not None:
            hi = _before((f.until_ms, 0))
        if cursor is not None:
            below = _before(_parse_id(cursor, "cursor"))
            hi = below if hi is None or below is None else min(hi, below)
        if hi is None or hi < lo:
            return None
        return lo, hi

    def _match(self, f: DLQFilter | None, eid: bytes, flds: dict[bytes, bytes]) -> DeadJob | None:
        decided = True if f is None else f._precheck(_sid(eid)[0], flds)
        if decided is False:
            return None
        dead = _dead_job(self.queue, eid, flds)
        return dead if decided or f.matches(dead) else None  # type: ignore[union-attr]

    def _select(self, f: DLQFilter | None, rows: list[Row]) -> list[tuple[Row, DeadJob | None]]:
        """The matching rows, with the decoded entry when deciding needed it."""
        if f is None:
            return [(row, None) for row in rows]
        out: list[tuple[Row, DeadJob | None]] = []
        for row in rows:
            decided = f._precheck(_sid(row[0])[0], row[1])
            if decided:
                out.append((row, None))
            elif decided is None:
                dead = _dead_job(self.queue, *row)
                if f.matches(dead):
                    out.append((row, dead))
        return out

    def _scan_newest(self, f: DLQFilter | None, scan_limit: int) -> Iterator[Row]:
        bounds = self._bounds(f)
        if bounds is None:
            return
        lo, hi = bounds
        scanned = 0
        while scanned < scan_limit:
            want = min(SCAN_CHUNK, scan_limit - scanned)
            rows = self.client.xrevrange(self.keys.dlq, _fmt(hi), _fmt(lo), count=want)
            yield from rows
            scanned += len(rows)
            nxt = _before(_sid(rows[-1][0])) if rows else None
            if len(rows) < want or nxt is None or nxt < lo:
                return
            hi = nxt

    def _scan_oldest(self, lo: StreamId, hi: StreamId, chunk: int) -> Iterator[list[Row]]:
        while lo <= hi:
            rows = self.client.xrange(self.keys.dlq, _fmt(lo), _fmt(hi), count=chunk)
            if rows:
                yield rows
            nxt = _after(_sid(rows[-1][0])) if rows else None
            if len(rows) < chunk or nxt is None:
                return
            lo = nxt

    def _edges(self) -> tuple[StreamId, StreamId] | None:
        """Ids of the oldest and newest entries; None when the DLQ is empty."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xrange(self.keys.dlq, "-", "+", count=1)
        pipe.xrevrange(self.keys.dlq, "+", "-", count=1)
        first, last = pipe.execute()
        if not first or not last:
            return None
        return _sid(first[0][0]), _sid(last[0][0])

    def _count_in(self, f: DLQFilter | None, lo: StreamId, hi: StreamId, chunk: int) -> int:
        if f is None or f._time_only():
            edges = self._edges()
            if edges is None:
                return 0
            if lo <= edges[0] and edges[1] <= hi:  # the range covers the whole DLQ
                return self.count()
            return sum(len(rows) for rows in self._scan_oldest(lo, hi, chunk))
        return sum(len(self._select(f, rows)) for rows in self._scan_oldest(lo, hi, chunk))

    def _move(self, dead: list[DeadJob], reset_attempts: bool, run_at_ms: int | None) -> int:
        argv: list[Any] = []
        when = "" if run_at_ms is None else str(run_at_ms)
        for d in dead:
            if d.job is not None:
                argv += (d.entry_id, _replayed(d, reset_attempts), when)
        if not argv:
            return 0
        return int(self._scripts.dlq_move(keys=[self.keys.dlq, self.keys.stream, self.keys.delayed, self.keys.totals],
                                          args=argv))

    def _sweep(
        self,
        filter: DLQFilter,
        act: Callable[[list[tuple[Row, DeadJob | None]]], int],
        chunk: int,
        progress: Callable[[int, int], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> int:
        """Act on every matching entry, oldest first, one chunk per call.

        Only entries present when the sweep starts are considered (the scan
        stops at the newest id seen then), so jobs that die during a long
        sweep are left for the operator to look at. ``progress(done, total)``
        is called once before the first chunk and after each one; ``done``
        counts matching entries handled, including ones someone else removed
        meanwhile and undecodable ones a replay must leave behind.
        ``should_stop`` is asked before each chunk.
        """
        if not isinstance(filter, DLQFilter):
            raise TypeError(
                f"Pass a DLQFilter (DLQFilter() matches every entry), not {type(filter).__name__}"
            )
        _positive(chunk, "chunk")
        f = None if filter.is_empty() else filter
        edges = self._edges()
        bounds = self._bounds(f)
        if edges is None or bounds is None:
            if progress is not None:
                progress(0, 0)
            return 0
        lo, hi = bounds[0], min(bounds[1], edges[1])
        total = self.count() if f is None else (self._count_in(f, lo, hi, max(chunk, 1000)) if lo <= hi else 0)
        done = acted = 0
        if progress is not None:
            progress(0, total)
        if lo > hi:
            return 0
        for rows in self._scan_oldest(lo, hi, chunk):
            if should_stop is not None and should_stop():
                break
            matched = self._select(f, rows)
            if matched:
                acted += act(matched)
                done += len(matched)
            if progress is not None:
                progress(done, total)
        return acted


def _check_run_at(run_at_ms: int | None) -> None:
    if run_at_ms is not None and (isinstance(run_at_ms, bool) or not isinstance(run_at_ms, int) or run_at_ms < 0):
        raise ValueError(f"run_at_ms must be a time in epoch milliseconds (0 or more), got {run_at_ms!r}")
