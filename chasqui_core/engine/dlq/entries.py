"""What one DLQ entry holds, and how its id and fields are read.

An entry's id is ``<milliseconds>-<sequence>``, the time the job died, so
the id helpers here turn times into id ranges for the readers. An entry
keeps the job's envelope (``j``) beside plain fields (reason, task, last
error) that filters can check without decoding the envelope. What entries
share (tracebacks, the last error's class and message) is stored once
(``shared.py``): ``decode_entry`` puts back what the entry holds, and
``shared.resolve`` the tracebacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.jobs.envelope import DecodeError, Job, decode
from chasqui_core.engine.dlq.fingerprint import fingerprint, fingerprint_id
from chasqui_core.engine.dlq.shared import restore_record

REASONS = ("retries_exhausted", "unrecoverable", "panic", "decode_failed", "internal", "unknown_task", "oversize",
           "bad_signature", "invalid", "cancelled")
"""Why a job was dead-lettered (the ``reason`` field of every DLQ entry)."""

MAX_PART = 2**64 - 1
"""The largest millisecond or sequence part a stream id can have."""

_ENTRY_ID = re.compile(r"^(\d{1,20})-(\d{1,20})\Z")
ID_PATTERN = r"^[0-9]{1,19}-[0-9]{1,19}$"
"""Entry ids as the API's schema publishes them: a part of what ``parse_id`` takes, since any 19 digits fit in
64 bits, so that an id the schema allows is never refused as out of range."""
_WORKER_LOST = "WorkerLost"

StreamId = tuple[int, int]
Row = tuple[bytes, dict[bytes, bytes]]
"""An entry as XRANGE returns it: its id and its fields."""


# --- entry ids ------------------------------------------------------------------


def parse_id(value: object, what: str = "entry id") -> StreamId:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    m = _ENTRY_ID.match(value) if isinstance(value, str) else None
    if m is None or int(m[1]) > MAX_PART or int(m[2]) > MAX_PART:
        raise ValueError(
            f"{value!r} is not a valid dead-letter {what}: expected '<milliseconds>-<sequence>', "
            f"for example '1700000000000-0'"
        )
    return int(m[1]), int(m[2])


def format_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def id_before(sid: StreamId) -> StreamId | None:
    """The greatest id below ``sid`` (turns an exclusive bound into an inclusive one)."""
    ms, seq = sid
    if seq:
        return ms, seq - 1
    return (ms - 1, MAX_PART) if ms else None


def id_after(sid: StreamId) -> StreamId | None:
    ms, seq = sid
    if seq < MAX_PART:
        return ms, seq + 1
    return (ms + 1, 0) if ms < MAX_PART else None


def id_of(raw: bytes | str) -> StreamId:
    """The id of an entry Redis returned (trusted, so not validated as ``parse_id`` does)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


# --- decoded entries ---------------------------------------------------------------


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
    stored_fingerprint_id: str = ""
    """The fingerprint id the worker wrote with the entry (its ``fp`` field); empty for older entries."""
    indexed_as: tuple[str, str, str, str, str] = ("", "", "", "", "")
    """The fields the index keeps the entry under, as stored (reason, task, error_class, fp, job_id): what a
    replay hands ``dlq_move.lua`` so it takes the entry out of the index without reading it again."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.error_class, self.error)

    @property
    def fingerprint_id(self) -> str:
        """The group this entry is counted in: the id written with it, or for an older entry the one computed."""
        return self.stored_fingerprint_id or fingerprint_id(self.fingerprint)

    @property
    def replayable(self) -> bool:
        """False when the payload cannot be decoded, so there is no job to send back."""
        return self.job is not None


def field_text(fields: dict[bytes, bytes], name: bytes) -> str:
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


def decode_entry(queue: str, raw_id: bytes | str, fields: dict[bytes, bytes]) -> DeadJob:
    """An entry as a ``DeadJob``; a payload that cannot be decoded gives ``job=None``, never an error,
    so one broken entry does not hide the page it is on."""
    entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
    payload = fields.get(b"j", b"")
    try:
        job: Job | None = decode(payload)
    except DecodeError:
        job = None
    reason = field_text(fields, b"reason")
    error = field_text(fields, b"error")
    error_class = field_text(fields, b"error_class")
    dead_at_ms = id_of(entry_id)[0]
    errors = list(job.errors) if job is not None else []
    restore_record(errors, error_class, error)  # the envelope's job shares these records: restored for both
    if reason == "panic":
        last = errors[-1] if errors and isinstance(errors[-1], dict) else None
        current = job.replays if job is not None else 0
        if last is None or last.get("class") != _WORKER_LOST or last.get("replays", current) != current:
            deliveries = field_text(fields, b"deliveries")
            errors.append(_synthesised(job, error, dead_at_ms, int(deliveries) if deliveries.isdigit() else None))
    return DeadJob(
        entry_id=entry_id,
        queue=queue,
        reason=reason,
        job_id=field_text(fields, b"job_id") or (job.id if job is not None else ""),
        task=field_text(fields, b"task") or (job.task if job is not None else ""),
        source_id=field_text(fields, b"source_id"),
        error_class=error_class,
        error=error,
        dead_at_ms=dead_at_ms,
        job=job,
        payload=payload,
        errors=errors,
        stored_fingerprint_id=field_text(fields, b"fp"),
        indexed_as=(reason, field_text(fields, b"task"), error_class, field_text(fields, b"fp"),
                    field_text(fields, b"job_id")),
    )
