"""Request and response shapes of the API's dead-letter queue, and of the background operations its bulk
replays and discards become.

Split from api/schemas.py, whose shared types (entry ids, moments, cursors) these use; every shape that
carries job data passes it through ``mask`` first, as there.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema

from chasqui_core.engine.dlq.browse import ErrorGroup
from chasqui_core.engine.dlq.entries import REASONS, DeadJob
from chasqui_core.masking import mask, mask_text
from chasqui_core.models import Operation

from .schemas import Cursor, EntryId, Limit, Moment, _dt

Reason = Literal[REASONS]  # type: ignore[valid-type]

MAX_IDS = 10_000
"""Entry ids one replay/discard request may name; bigger sets go by filter."""


# --- the dead-letter queue ---------------------------------------------------------------------


class DLQQuery(Schema):
    task: str | None = Field(None, max_length=300, description="Exact task name.")
    reason: Reason | None = None
    error_class: str | None = Field(None, max_length=300, description="Class name, with or without module.")
    error_text: str | None = Field(None, max_length=1000, description="Text in any error message (case-insensitive).")
    fingerprint: str | None = Field(None, max_length=1000,
                                    description="One error group: its fingerprint_id as /dlq/groups or an entry "
                                                "gives it (the fingerprint's text is accepted too).")
    since: Moment | None = Field(None, description="Died at or after (ISO 8601; no zone means UTC).")
    until: Moment | None = Field(None, description="Died before (ISO 8601; no zone means UTC).")


class DLQPageQuery(DLQQuery):
    cursor: EntryId | None = Cursor
    limit: int = Limit


class FilterIn(DLQQuery):
    """Which entries to act on; every field left out matches everything ({} is the whole DLQ)."""


class DeadJobSummaryOut(Schema):
    entry_id: str
    queue: str
    reason: str
    job_id: str
    task: str
    source_id: str
    error_class: str
    error: str
    dead_at_ms: int
    dead_at: datetime | None
    attempts: int = Field(description="Failed runs recorded in the job's history.")
    replays: int
    replayable: bool = Field(description="False when the payload cannot be decoded, so there is no job to replay.")
    fingerprint: str = Field(description="The error's group: class and message with variable parts and secrets "
                                         "replaced.")
    fingerprint_id: str = Field(description="The group's id, to filter on (the `fingerprint` filter).")

    @classmethod
    def fields_of(cls, d: DeadJob) -> dict[str, Any]:
        return dict(
            entry_id=d.entry_id, queue=d.queue, reason=d.reason, job_id=d.job_id, task=d.task,
            source_id=d.source_id, error_class=d.error_class, error=mask_text(d.error), dead_at_ms=d.dead_at_ms,
            dead_at=_dt(d.dead_at_ms), attempts=len(d.errors), replays=d.job.replays if d.job else 0,
            replayable=d.job is not None, fingerprint=mask_text(d.fingerprint), fingerprint_id=d.fingerprint_id,
        )

    @classmethod
    def from_dead(cls, d: DeadJob) -> DeadJobSummaryOut:
        return cls(**cls.fields_of(d))


class DeadJobOut(DeadJobSummaryOut):
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    max_attempts: int | None
    created_at_ms: int | None
    errors: list[dict[str, Any]] = Field(description="Every failed run: attempt, class, message, traceback, "
                                                     "worker, started_at, finished_at, duration_ms.")

    @classmethod
    def from_dead(cls, d: DeadJob) -> DeadJobOut:
        job = d.job
        return cls(
            **cls.fields_of(d),
            args=mask(list(job.args)) if job else None,
            kwargs=mask(dict(job.kwargs)) if job else None,
            max_attempts=job.max_attempts if job and isinstance(job.max_attempts, int) else None,
            created_at_ms=job.created_at if job and isinstance(job.created_at, int) else None,
            errors=mask([e for e in d.errors if isinstance(e, dict)]),
        )


class DLQPageOut(Schema):
    items: list[DeadJobSummaryOut]
    next_cursor: str | None
    scanned: int = Field(description="Entries read to fill this page.")


class ErrorGroupOut(Schema):
    fingerprint: str
    fingerprint_id: str = Field(description="Pass as the `fingerprint` filter to list or act on this group.")
    error_class: str
    sample_message: str
    count: int
    first_seen_ms: int
    last_seen_ms: int
    first_seen: datetime | None
    last_seen: datetime | None
    sample_entry_id: str
    tasks: list[str]

    @classmethod
    def from_group(cls, g: ErrorGroup) -> ErrorGroupOut:
        return cls(fingerprint=mask_text(g.fingerprint), fingerprint_id=g.id, error_class=g.error_class,
                   sample_message=mask_text(g.sample_message), count=g.count, first_seen_ms=g.first_seen_ms,
                   last_seen_ms=g.last_seen_ms, first_seen=_dt(g.first_seen_ms), last_seen=_dt(g.last_seen_ms),
                   sample_entry_id=g.sample_entry_id, tasks=g.tasks)


class GroupsOut(Schema):
    items: list[ErrorGroupOut]
    whole: bool = Field(description="True: every matching entry is grouped (from the DLQ's index). False: the "
                                    "newest matching entries a scan reached (a filter on text, or an index being "
                                    "rebuilt).")
    total_groups: int = Field(description="Groups in all; `items` holds the biggest.")
    other_entries: int = Field(description="Entries in the groups not listed: with the listed counts, the total.")


def _ids_or_filter(*by_filter_only: str):
    """The schema of a body that takes ``ids`` or a ``filter``, exactly one, as the service insists; with ids,
    none of ``by_filter_only`` either. Written into the schema by hand: a model's fields cannot say that one
    excludes another, and without it a client reading the schema would send both, or neither, and be refused.
    Null is left out of these fields' types for the same reason: the service reads null as "not given"."""
    def extra(schema: dict[str, Any]) -> None:
        props = schema["properties"]
        for name in ("ids", "filter", *by_filter_only):
            options = props[name].pop("anyOf", None)
            if options:
                props[name].update(next(o for o in options if o.get("type") != "null"))
            props[name].pop("default", None)
        schema["oneOf"] = [
            {"required": ["ids"], "not": {"anyOf": [{"required": [n]} for n in ("filter", *by_filter_only)]}},
            {"required": ["filter"], "not": {"required": ["ids"]}},
        ]
    return extra


class BulkIn(Schema):
    model_config = {"json_schema_extra": _ids_or_filter()}

    ids: list[EntryId] | None = Field(None, min_length=1, max_length=MAX_IDS,
                                      description="Entry ids to act on; or give a filter instead.")
    filter: FilterIn | None = Field(None, description="Act on every entry matching; {} matches the whole DLQ.")


class ReplayIn(BulkIn):
    model_config = {"json_schema_extra": _ids_or_filter("rate")}

    reset_attempts: bool = Field(True, description="True: a fresh retry budget. False: exactly one more attempt.")
    run_at: Moment | None = Field(None, description="Replay at this time instead of now (ISO 8601).")
    rate: int | None = Field(None, ge=1, le=1_000_000,
                             description="By filter only: replay at most this many jobs per second, "
                                         "so the workers are not flooded (always runs in the background).")


class OneReplayIn(Schema):
    reset_attempts: bool = True
    run_at: Moment | None = None


# --- operations ----------------------------------------------------------------------------------


class OperationOut(Schema):
    id: uuid.UUID
    kind: str
    queue: str
    filter: dict[str, Any]
    options: dict[str, Any]
    status: Literal["pending", "running", "done", "cancelled", "failed"]
    done: int
    total: int
    count: int = Field(description="Entries actually replayed or discarded (final once finished).")
    error: str
    created_by: str | None
    created_at: datetime
    finished_at: datetime | None
    cancel_requested: bool
    total_exact: bool = Field(True, description="False while ``total`` is an estimate (the sweep counts exactly).")
    waiting_for_worker: bool = Field(False, description="True when it waits and no worker of its queue is alive.")

    @classmethod
    def from_op(cls, op: Operation) -> OperationOut:
        return cls(id=op.pk, kind=op.kind, queue=op.queue, filter=op.filter, options=op.options, status=op.status,
                   done=op.done, total=op.total, count=op.count, error=mask_text(op.error),
                   created_by=op.created_by.get_username() if op.created_by_id else None,
                   created_at=op.created_at, finished_at=op.finished_at, cancel_requested=op.cancel_requested,
                   total_exact=getattr(op, "total_exact", True),
                   waiting_for_worker=getattr(op, "waiting_for_worker", False))


class DLQSearchQuery(Schema):
    q: str = Field(min_length=1, max_length=200, pattern=r"[^\s\x1c-\x1f]",  # not only white space
                   description="Text to find (case-insensitive) in the job id, task, errors or arguments (secrets "
                               "masked).")
    cursor: EntryId | None = Field(None, description="``next_cursor`` of the previous answer, to go on.")
    limit: int = Field(50, ge=1, le=200)


class DLQSearchOut(Schema):
    items: list[DeadJobSummaryOut]
    next_cursor: str | None = Field(description="Pass back as ``cursor`` to go on; null once the whole DLQ was read.")
    scanned: int = Field(description="Entries this request read.")
    total: int = Field(description="Entries in the DLQ when this request started.")


class OperationListOut(Schema):
    items: list[OperationOut]


class BulkOut(Schema):
    background: bool = Field(description="True when the work runs in the background: poll the operation.")
    count: int | None = Field(description="Entries replayed or discarded (when done inline).")
    operation: OperationOut | None
