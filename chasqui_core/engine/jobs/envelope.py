"""The job envelope: what travels through Redis for every job.

A compact, versioned msgpack array. Positional fields keep it small and quick
to pack; the version in front lets a later release read what an earlier one
wrote. Arguments are limited to JSON types (None, bool, int, float, str, list,
dict with str keys) so that every job can be shown, filtered and replayed from
the console and API exactly as the producer meant it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

VERSION = 1
FIELDS = 14
"""Fields in an envelope of this version."""


class DecodeError(ValueError):
    """A stream entry that is not a job envelope this version can read."""


@dataclass(slots=True)
class Job:
    id: str
    task: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0
    """Runs already made (0 on the first delivery)."""
    created_at: int = 0
    """Milliseconds since the epoch, producer clock."""
    max_attempts: int | None = None
    """Per-job budget of runs; None defers to the task's, then the worker's default."""
    backoff: dict[str, Any] | None = None
    """Per-job BackoffSpec as a dict (see backoff.BackoffSpec.to_dict)."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """One record per failed run: see errors_record()."""
    replays: int = 0
    """How many times an operator sent this job back from the dead-letter queue."""
    result_ttl: int = 0
    """Seconds to keep the outcome for get_result(); 0 keeps nothing."""
    deaths: int = 0
    """Runs lost because the worker running them died (a poison pill counts these)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Integration details (Django backend alias, priority...) the engine carries untouched."""

    def after_failure(self, attempt: int, error: dict[str, Any], deaths: int) -> Job:
        """A copy of this job with one more failed run in its history (``attempt`` runs in all, ``deaths`` lost).

        Built field by field rather than with ``dataclasses.replace``, which
        costs several times more.
        """
        return Job(self.id, self.task, self.args, self.kwargs, attempt, self.created_at, self.max_attempts,
                   self.backoff, [*self.errors, error], self.replays, self.result_ttl, deaths, self.meta)

    def encode_after_failure(self, attempt: int, error: dict[str, Any], deaths: int) -> bytes:
        """``after_failure(...).encode()`` without building the copy: the envelope a failed run writes back."""
        return self._packed(attempt, [*self.errors, error], deaths)

    def encode(self) -> bytes:
        return self._packed(self.attempt, self.errors, self.deaths)

    def _packed(self, attempt: int, errors: list[dict[str, Any]], deaths: int) -> bytes:
        packed: bytes = _packer.pack([VERSION, self.id, self.task, self.args, self.kwargs, attempt, self.created_at,
                                      self.max_attempts, self.backoff, errors, self.replays, self.result_ttl, deaths,
                                      self.meta])
        return packed


_packer = msgpack.Packer(use_bin_type=True)


def id_head(job_id: str) -> bytes:
    """The bytes every envelope of ``job_id`` starts with: the array's length, the version and the id.

    Members of a sorted set that share a score are in byte order, so those of
    one id sit together there (lookup.py searches for them by this head).
    """
    head: bytes = _packer.pack([VERSION, job_id])
    return bytes([0x90 | FIELDS]) + head[1:]


def pack_job(job_id: str, task: str, args: list[Any], kwargs: dict[str, Any], created_at: int,
             max_attempts: int | None, backoff: dict[str, Any] | None, result_ttl: int, meta: dict[str, Any]) -> bytes:
    """Encode a brand-new job without building a Job first (the producer's fast path)."""
    packed: bytes = _packer.pack([VERSION, job_id, task, args, kwargs, 0, created_at, max_attempts, backoff, [], 0,
                         result_ttl, 0, meta])
    return packed


_unpackb = msgpack.unpackb


def decode(data: bytes) -> Job:
    """Read an envelope; raise DecodeError, with the reason in words, for anything else.

    Runs once per delivered job, so the well-formed case costs one unpack,
    one constructor call and a few exact type checks.
    """
    try:
        raw = _unpackb(data)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not a msgpack job envelope ({type(exc).__name__}: {exc})") from None
    if type(raw) is not list or not raw:
        raise DecodeError("not a job envelope: expected a msgpack array")
    if raw[0] != VERSION:
        raise DecodeError(f"unsupported envelope version {raw[0]!r} (this worker reads {VERSION})")
    if len(raw) != FIELDS:
        raise DecodeError(f"malformed envelope: {len(raw)} fields, expected {FIELDS}")
    # checked as locals, before the Job is built: a local costs less to read than a slot
    (_, job_id, task, args, kwargs, attempt, created, max_attempts, backoff, errors, replays, ttl, deaths,
     meta) = raw
    if type(job_id) is not str or not job_id or type(task) is not str or not task:
        raise DecodeError("malformed envelope: job id and task name must be non-empty strings")
    if type(args) is not list or type(kwargs) is not dict:
        raise DecodeError("malformed envelope: args must be a list and kwargs a map")
    if type(errors) is not list or type(meta) is not dict:
        if meta is None and type(errors) is list:
            meta = {}
        else:
            raise DecodeError("malformed envelope: the error history must be a list and meta a map")
    job = Job(job_id, task, args, kwargs, attempt, created, max_attempts, backoff, errors, replays, ttl, deaths,
              meta)
    # counters and limits: exact int checks cost little and keep a bad value from reaching Redis
    if not (type(attempt) is int and type(replays) is int and type(deaths) is int and type(ttl) is int
            and type(created) is int and attempt >= 0 and replays >= 0 and deaths >= 0 and created >= 0
            and 0 <= ttl <= MAX_RESULT_TTL):
        raise DecodeError(_bad_number(job))
    if max_attempts is not None and (type(max_attempts) is not int or max_attempts < 1):
        raise DecodeError(f"malformed envelope: max_attempts must be empty or a whole number of 1 or more, "
                          f"got {max_attempts!r:.50}")
    if backoff is not None and type(backoff) is not dict:
        raise DecodeError(f"malformed envelope: backoff must be empty or a map, got {backoff!r:.50}")
    for record in errors:
        if type(record) is not dict:
            raise DecodeError(f"malformed envelope: an error history entry is not a map ({record!r:.50})")
    return job


MAX_RESULT_TTL = 366 * 24 * 3600
"""A year: longer makes no sense for a job's outcome, and keeps TTL arithmetic in range."""


def _bad_number(job: Job) -> str:
    """Say which counter of an envelope is wrong, in words (only on the rare bad envelope)."""
    checks = (("attempt", job.attempt, 0, None), ("replays", job.replays, 0, None), ("deaths", job.deaths, 0, None),
              ("created_at", job.created_at, 0, None), ("result_ttl", job.result_ttl, 0, MAX_RESULT_TTL))
    for name, value, low, high in checks:
        if type(value) is not int:
            return f"malformed envelope: {name} must be a whole number, got {value!r:.50}"
        if value < low or (high is not None and value > high):
            limit = f"between {low} and {high}" if high is not None else f"{low} or more"
            return f"malformed envelope: {name} must be {limit}, got {value}"
    return "malformed envelope: a counter is out of range"


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
"""Every 10-bit value as two base-32 characters: a ULID is 13 table lookups."""
_last_ms = -1
_last_prefix = ""


def new_job_id() -> str:
    """A ULID: 48 bits of milliseconds then 80 random bits, in Crockford base 32.

    Sortable by creation time, like the stream ids. Built here rather than with
    a ULID library because producers call it once per job and it must cost
    about a microsecond.
    """
    global _last_ms, _last_prefix
    ms = time.time_ns() // 1_000_000
    if ms != _last_ms:
        # 48 timestamp bits padded to 50 = 10 characters
        p = _PAIRS
        _last_prefix = (p[(ms >> 40) & 1023] + p[(ms >> 30) & 1023] + p[(ms >> 20) & 1023]
                        + p[(ms >> 10) & 1023] + p[ms & 1023])
        _last_ms = ms
    r = random.getrandbits(80)  # the module-level generator is reseeded after fork
    p = _PAIRS
    return (_last_prefix + p[r >> 70] + p[(r >> 60) & 1023] + p[(r >> 50) & 1023] + p[(r >> 40) & 1023]
            + p[(r >> 30) & 1023] + p[(r >> 20) & 1023] + p[(r >> 10) & 1023] + p[r & 1023])


def now_ms() -> int:
    return int(time.time() * 1000)


_SCALARS = (str, int, float, bool, type(None))


def check_json_types(value: Any, where: str = "args") -> None:
    """Raise TypeError naming the first value that JSON cannot carry.

    msgpack would happily carry bytes or non-string keys that the console, the
    API and Django's own TaskResult cannot show, so refuse them at the door.
    """
    cls = type(value)
    if cls in _SCALARS:
        if cls is float and (value != value or value in (float("inf"), float("-inf"))):
            raise TypeError(f"Job {where} must be JSON-serializable: {value!r} is not a finite number")
        return
    if cls is list or cls is tuple:
        for i, item in enumerate(value):
            if type(item) not in _SCALARS or type(item) is float:
                check_json_types(item, f"{where}[{i}]")
        return
    if cls is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(
                    f"Job {where} must be JSON-serializable: dict keys must be strings, "
                    f"found a key of type {type(key).__name__} ({key!r})"
                )
            if type(item) not in _SCALARS or type(item) is float:
                check_json_types(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"Job {where} must be JSON-serializable: found a value of type "
        f"{cls.__module__ + '.' if cls.__module__ != 'builtins' else ''}{cls.__qualname__}"
    )


TRACEBACK_LIMIT = 8_000
"""Characters of traceback kept per failed run; the rest is cut in the middle."""


def bounded_traceback(text: str, limit: int = TRACEBACK_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def error_record(
    *,
    attempt: int,
    exc_class: str,
    message: str,
    traceback: str,
    worker: str,
    started_at: int,
    finished_at: int,
    backoff_ms: int | None = None,
) -> dict[str, Any]:
    """One failed run, as kept in the job's error history; ``backoff_ms`` when a retry follows it."""
    record = {
        "attempt": attempt,
        "class": exc_class,
        "message": message[:2000],
        "traceback": bounded_traceback(traceback),
        "worker": worker,
        "started_at": started_at,
        "finished_at": finished_at,
        "duration_ms": max(0, finished_at - started_at),
    }
    if backoff_ms is not None:
        record["backoff_ms"] = backoff_ms
    return record
