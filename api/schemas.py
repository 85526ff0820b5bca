"""Request and response shapes of the HTTP API.

Responses are built from the engine's value objects by the ``from_*``
constructors here, and every one that carries job data (arguments, error
messages, tracebacks, return values) passes it through ``mask`` first: no
endpoint can forget to.
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import AfterValidator, WithJsonSchema

from chasqui_core.engine.jobs import job_ids
from chasqui_core.engine.timing.delayed import CURSOR_PATTERN as DELAYED_CURSOR_PATTERN
from chasqui_core.engine.dlq.entries import ID_PATTERN as ENTRY_ID_PATTERN
from chasqui_core.engine.store.keys import QUEUE_NAME_PATTERN
from chasqui_core.engine.ops.metrics import RESOLUTIONS
from chasqui_core.engine.jobs.priority import job_priority
from chasqui_core.masking import mask, mask_text
from chasqui_core.models import AuditEntry
from chasqui_core.services.common import MAX_PAGE

MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000
"""Ten years: a longer delay is a typo, not a plan."""

Limit = Field(50, ge=1, le=MAX_PAGE, description=f"Items per page, 1 to {MAX_PAGE}.")
Cursor = Field(None, max_length=200, description="The next_cursor of the previous page; omit for the first page.")
AUDIT_CURSOR_PATTERN = r"^[0-9]{1,18}$"
"""What services.audit takes as a cursor: an entry's id."""

METRICS_WINDOW_MAX = min(r.max_window for r in RESOLUTIONS.values())
MetricsWindow = Annotated[int, WithJsonSchema({
    "type": "integer", "minimum": 1, "maximum": METRICS_WINDOW_MAX,
    "description": f"Number of points (default: an hour or a day): up to {METRICS_WINDOW_MAX} at either resolution, "
                   f"up to {RESOLUTIONS['second'].max_window} at resolution=second.",
})]
"""The most points the schema promises is what holds at every resolution: in OpenAPI a query parameter's
bounds cannot depend on another parameter's value. The engine checks the bound of the resolution asked for,
and says it in words."""


def _dt(ms: int | None) -> datetime | None:
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


# --- errors ------------------------------------------------------------------


JobId = Annotated[str, AfterValidator(job_ids.check), WithJsonSchema({
    "type": "string", "minLength": 1, "maxLength": job_ids.MAX_LENGTH, "pattern": job_ids.PATTERN,
    "description": job_ids.RULE[0].upper() + job_ids.RULE[1:] + ".",
})]
"""A job id as the API takes it: the engine's own check (job_ids.check), so the error says what is wrong in
words, and its pattern in the schema, so the schema allows exactly what the check does."""

QueueName = Annotated[str, WithJsonSchema({
    "type": "string", "minLength": 1, "maxLength": 100, "pattern": QUEUE_NAME_PATTERN,
    "description": "A queue's name: 1 to 100 letters, digits, '_', '-' or '.'.",
})]
"""A queue in a path: the schema publishes the engine's rule; a name outside it is answered as a queue not
found (404), by the service, as it always was."""

EntryId = Annotated[str, WithJsonSchema({
    "type": "string", "pattern": ENTRY_ID_PATTERN, "maxLength": 39,
    "description": "A dead-letter entry id, '<milliseconds>-<sequence>', for example '1700000000000-0'.",
})]
"""A dead-letter entry id or cursor: checked by the engine (entries.parse_id, an error in words), published as
the pattern of what it takes."""


AuditCursor = Annotated[str, WithJsonSchema({"type": "string", "pattern": AUDIT_CURSOR_PATTERN})]
DelayedCursor = Annotated[str, WithJsonSchema({"type": "string", "pattern": DELAYED_CURSOR_PATTERN})]
"""A cursor as the schema publishes it; what it holds is checked where it is read, in words."""


Moment = Annotated[datetime, WithJsonSchema({
    "type": "string", "format": "date-time", "pattern": r"^(19[89][0-9]|2[0-9]{3})-",
    "description": "ISO 8601, in the years 1980 to 2999 (no zone means UTC).",
})]
"""A time a job died or is to run: the service refuses times before 1970 or past what a clock can hold, in
words; the schema states a range of years well inside both, which a date-time's format cannot."""


class ErrorOut(Schema):
    detail: str = Field(description="What went wrong, in words.")
    errors: list[dict[str, Any]] | None = Field(None, description="Per-field problems, for invalid input.")


# --- queues ---------------------------------------------------------------------


class QueueStatsOut(Schema):
    name: str
    stream_length: int = Field(description="Entries in the stream: waiting plus delivered and not yet settled.")
    pending: int = Field(description="Delivered to a worker and not settled yet.")
    in_flight: int = Field(description="Jobs running, as reported by live workers.")
    delayed: int = Field(description="Jobs in the delayed set (scheduled runs and retries waiting).")
    overdue: int = Field(description="Delayed jobs past their run-at time, not yet promoted.")
    oldest_overdue_age_ms: int
    dlq: int = Field(description="Entries in the dead-letter queue.")
    paused: bool
    workers: int = Field(description="Workers with a fresh heartbeat on this queue.")
    lag: int | None = Field(description="Entries the consumer group has not read yet (Redis 7+).")
    bands: dict[str, int] = Field(
        default_factory=dict,
        description="Jobs waiting per priority band ('high', 'default', 'low'), for a queue that has prioritised "
                    "jobs; empty otherwise. stream_length, pending and lag are summed over the bands.")


class QueueListOut(Schema):
    items: list[QueueStatsOut]


class LimitBucketOut(Schema):
    bucket: str = Field(description="'all' for a limit without a key; else the key's value (a digest when long).")
    running: int = Field(description="Concurrency slots held now.")
    waiting: int = Field(description="Jobs in the delayed set until the bucket has room.")
    started: int = Field(description="Starts within the rate's window.")


class LimitOut(Schema):
    scope: str = Field(description="The queue name or task path the limit is set on.")
    setting: str = Field(description="What it allows, in words; empty when this server's settings no longer "
                                      "name it.")
    running: int
    waiting: int
    started: int
    buckets: list[LimitBucketOut] = Field(description="The busiest buckets, at most 20.")


class TotalsOut(Schema):
    queue: str
    counters: dict[str, int] = Field(
        description="All-time counters, every one listed (0 when never counted): enqueued, fetched (entries read by "
                    "workers), completed, failed (runs that raised), retried, dlq (dead-lettered, any reason), "
                    "replayed, promoted, skipped, bad_signature, deferred, purged, lost (runs under way in a worker "
                    "that stopped answering, charged to their jobs), recovered (jobs taken back from such a worker "
                    "before they started, uncharged).")
    dead_lettered: dict[str, int] = Field(
        description="Jobs dead-lettered per reason (panic, retries_exhausted, unrecoverable, ...), for the reasons "
                    "met at least once; they add up to counters.dlq.")


class LimitListOut(Schema):
    queue: str
    items: list[LimitOut]


class SwitchOut(Schema):
    queue: str
    paused: bool
    changed: bool = Field(description="False when the queue already was in that state.")


class MetricsOut(Schema):
    queue: str
    resolution: Literal["second", "minute"]
    start_ms: int = Field(description="Start of the oldest bucket, epoch milliseconds (Redis server clock).")
    step_ms: int
    fields: list[str]
    points: dict[str, list[int]] = Field(
        description="One list per counter, oldest bucket first: enqueued, completed, failed, "
                    "retried (retries scheduled), dlq (routed to the DLQ), promoted."
    )


# --- tasks and jobs -------------------------------------------------------------------


class TaskOut(Schema):
    name: str
    queue: str
    max_attempts: int | None
    parameters: list[str]


class EnqueueIn(Schema):
    task: str = Field(min_length=1, max_length=300,
                      description="The task's module path, e.g. emails.tasks.send_welcome_email.")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    delay_ms: int | None = Field(None, ge=0, le=MAX_DELAY_MS, description="Run no sooner than this many ms from now.")
    attempts: int | None = Field(None, ge=1, le=1000, description="Runs allowed, first one included.")
    backoff: int | str | dict[str, Any] | None = Field(
        None, description="Milliseconds (fixed), a strategy name, or a backoff object; see docs/retries.md."
    )
    job_id: JobId | None = Field(None, description="Your id for the job: a second enqueue with the same id is "
                                                   "ignored.")
    priority: int | None = Field(None, ge=-100, le=100,
                                 description="Higher runs first: above 0 the queue's high band, below 0 its low band; "
                                             "none: the task's own (see docs/flow-control.md).")


class EnqueueOut(Schema):
    job_id: str
    queue: str
    task: str
    status: str
    run_after: datetime | None


class DeathOut(Schema):
    entry_id: str = Field(description="The dead-letter entry: replay or discard it under /api/queues/{queue}/dlq/.")
    reason: str
    dead_at: datetime | None
    error_class: str
    error: str


class JobOut(Schema):
    id: str
    state: Literal["waiting", "running", "delayed", "dead", "finished"] = Field(
        description="waiting in the stream, running (delivered to a worker), delayed (scheduled or retrying), "
                    "dead (in the DLQ), finished (its stored result, when RESULT_TTL keeps one).")
    status: str = Field(description="Django's TaskResult status: READY, RUNNING, SUCCESSFUL or FAILED.")
    queue: str
    task: str
    args: list[Any] | None = Field(description="Masked; null when the payload cannot be decoded.")
    kwargs: dict[str, Any] | None
    attempt: int = Field(description="Runs already made.")
    max_attempts: int | None
    replays: int
    priority: int = Field(0, description="-100 to 100, higher runs first; 0 by default. Above 0 the job is in "
                                         "the queue's high band, below 0 in its low band.")
    created_at: datetime | None
    stream_entry: str | None = Field(description="Its entry in the queue's stream (waiting or running).")
    worker: str | None = Field(description="The worker running it, or the consumer its entry was delivered to.")
    deliveries: int
    started_at: datetime | None
    run_at: datetime | None = Field(description="When a delayed job is due.")
    death: DeathOut | None
    finished_at: datetime | None
    return_value: Any = None
    errors: list[dict[str, Any]] = Field(description="Every failed run: attempt, class, message, traceback, "
                                                     "worker, started_at, finished_at, duration_ms (masked).")
    searched: list[str] = Field(description="Where the lookup read, in words.")
    scanned: int = Field(description="Entries read to find it.")
    cancel_requested_at: datetime | None = Field(
        None, description="When a cancel was asked for, while the workers have yet to act on it.")
    progress: ProgressOut | None = Field(None, description="The latest progress the job reported, if any.")

    @classmethod
    def from_lookup(cls, found) -> JobOut:
        job, result, dead, run = found.job, found.result or {}, found.dead, found.running
        status = {"waiting": "READY", "delayed": "READY", "running": "RUNNING", "dead": "FAILED"}.get(
            found.state, str(result.get("status") or ""))
        errors = job.errors if job is not None else result.get("errors") or []
        if dead is not None:
            errors = dead.errors
        started = run.started_at_ms if run is not None else None
        return cls(
            id=found.job_id, state=found.state, status=status, queue=found.queue or "",
            task=(job.task if job is not None else (dead.task if dead else str(result.get("task") or ""))),
            args=mask(list(job.args)) if job is not None else mask(result.get("args")),
            kwargs=mask(dict(job.kwargs)) if job is not None else mask(result.get("kwargs")),
            attempt=job.attempt if job is not None else len(errors),
            max_attempts=job.max_attempts if job is not None else None,
            replays=job.replays if job is not None else 0,
            priority=job_priority(job.meta) if job is not None else 0,
            created_at=_dt(job.created_at if job is not None else result.get("enqueued_at") or found.created_ms),
            stream_entry=found.stream_entry,
            worker=run.worker if run is not None else found.delivered_to or (str(result.get("worker") or "") or None),
            deliveries=found.deliveries,
            started_at=_dt(started if started is not None else result.get("started_at")),
            run_at=_dt(found.run_at_ms),
            death=DeathOut(entry_id=dead.entry_id, reason=dead.reason, dead_at=_dt(dead.dead_at_ms),
                           error_class=dead.error_class, error=mask_text(dead.error)) if dead is not None else None,
            finished_at=_dt(result.get("finished_at")) if found.state == "finished" else None,
            return_value=mask(result.get("return_value")) if found.state == "finished" else None,
            errors=mask([e for e in errors if isinstance(e, dict)]),
            searched=list(found.searched), scanned=found.scanned,
            cancel_requested_at=_dt(found.cancel_requested_ms),
            progress=ProgressOut.from_progress(found.progress),
        )


class ProgressOut(Schema):
    value: float = Field(description="The number the job reported: a percentage, or items done.")
    message: str = Field(description="Its short message (masked).")
    at: datetime | None = Field(description="When the job reported it (the worker's clock).")

    @classmethod
    def from_progress(cls, progress) -> ProgressOut | None:
        if progress is None:
            return None
        return cls(value=progress.value, message=mask_text(progress.message), at=_dt(progress.at_ms))


class CancelJobOut(Schema):
    job_id: str
    queue: str
    state: Literal["waiting", "running", "delayed"] = Field(description="Where the job was when it was cancelled.")
    requested_at: datetime | None = Field(description="When the request was recorded (server clock).")
    moved_from_delayed: bool = Field(description="The job was delayed: it left the delayed set at once.")


# --- the delayed set --------------------------------------------------------------------------


class DelayedJobOut(Schema):
    job_id: str
    task: str
    run_at_ms: int
    run_at: datetime | None
    attempt: int = Field(description="Runs already made: 0 for a scheduled job, 1+ for a retry waiting.")
    args: list[Any]
    kwargs: dict[str, Any]
    errors: list[dict[str, Any]]

    @classmethod
    def from_job(cls, job) -> DelayedJobOut:
        return cls(job_id=job.job_id, task=job.task, run_at_ms=job.run_at_ms, run_at=_dt(job.run_at_ms),
                   attempt=job.attempt, args=mask(list(job.args)), kwargs=mask(dict(job.kwargs)),
                   errors=mask([e for e in job.errors if isinstance(e, dict)]))


class DelayedPageOut(Schema):
    items: list[DelayedJobOut]
    next_cursor: str | None


class RunNowOut(Schema):
    job_id: str
    entry_id: str = Field(description="The job's new stream entry id.")


class CancelledOut(Schema):
    job_id: str
    cancelled: bool


# --- workers and audit ------------------------------------------------------------------------------


class CurrentJobOut(Schema):
    task: str
    job_id: str
    started_at: datetime | None = Field(description="When this run started (the worker's clock).")


class WorkerOut(Schema):
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    processed: int
    failed: int
    started_at_ms: int
    last_seen_ms: int
    last_seen: datetime | None
    stale: bool = Field(description="No heartbeat for longer than stale_after_ms: stopped or cut off.")
    problem: str = Field("", description="What the worker reports wrong with itself; empty when healthy.")
    memory_kb: int = Field(0, description="Resident memory of the worker process, KiB (0 when unknown).")
    current: list[CurrentJobOut] = Field(
        default_factory=list, description="Its longest-running jobs at the last heartbeat, oldest first (at most 20).")
    supervisor_pid: int | None = Field(None, description="Pid of the `runworker --processes` supervisor it runs "
                                                         "under (on the same host); null when it runs alone.")
    state: Literal["running", "quiet", "stopping"] = Field(
        "running", description="running; quiet (asked to take no more jobs); stopping (finishing, then exits).")

    @classmethod
    def from_info(cls, w) -> WorkerOut:
        return cls(id=w.id, host=w.host, pid=w.pid, queues=w.queues, concurrency=w.concurrency,
                   in_flight=w.in_flight, processed=w.processed, failed=w.failed, started_at_ms=w.started_at_ms,
                   last_seen_ms=w.last_seen_ms, last_seen=_dt(w.last_seen_ms), stale=w.stale,
                   problem=w.problem, memory_kb=w.memory_kb,
                   current=[CurrentJobOut(task=j.task, job_id=j.job_id, started_at=_dt(j.started_at_ms))
                            for j in w.current],
                   supervisor_pid=w.supervisor_pid,
                   state=w.state if w.state in ("running", "quiet", "stopping") else "running")


class WorkerListOut(Schema):
    items: list[WorkerOut]


class RunningJobOut(Schema):
    queue: str
    entry_id: str = Field(description="Its entry in the stream of the job's priority band (see priority).")
    priority: int = Field(0, description="-100 to 100, higher runs first; 0 by default.")
    task: str = Field(description="Empty when the run was settled between the reads, or is not readable.")
    job_id: str
    started_at: datetime | None


class RunningPageOut(Schema):
    items: list[RunningJobOut]
    total: int = Field(description="Runs under way on the worker, over all its queues.")
    offset: int


class WorkerCommandOut(Schema):
    worker: str
    command: Literal["quiet", "stop"]
    changed: bool = Field(description="False when the worker had been asked already (a stop is never undone by "
                                      "a quiet).")


class PurgeOut(Schema):
    queue: str
    purged: int = Field(description="Waiting jobs deleted (jobs a worker held were left alone).")


class AuditQuery(Schema):
    action: Literal[tuple(AuditEntry.Action.values)] | None = None  # type: ignore[valid-type]
    queue: str | None = Field(None, max_length=100)
    actor: str | None = Field(None, max_length=200, description="Username (or the start of it).")
    source: Literal["api", "console", "cli"] | None = None
    since: datetime | None = None
    until: datetime | None = None
    cursor: AuditCursor | None = Cursor
    limit: int = Limit


class AuditOut(Schema):
    id: int
    at: datetime
    actor: str
    action: str
    queue: str
    source: str
    target_ids: list[Any]
    filter: dict[str, Any]
    count: int
    detail: dict[str, Any]

    @classmethod
    def from_entry(cls, e: AuditEntry) -> AuditOut:
        return cls(id=e.id, at=e.at, actor=e.actor_repr, action=e.action, queue=e.queue, source=e.source,
                   target_ids=list(e.target_ids or []), filter=dict(e.filter or {}), count=e.count,
                   detail=mask(dict(e.detail or {})))


class AuditPageOut(Schema):
    items: list[AuditOut]
    next_cursor: str | None


class TaskFiguresOut(Schema):
    task: str
    runs: int = Field(description="Runs that ended in the range (succeeded or raised).")
    failures: int = Field(description="Runs that raised (retried or dead).")
    mean_ms: float
    p50_ms: int | None = Field(description="At most this many ms for half the runs: the upper bound of the "
                                           "histogram bucket holding the median; null above 300,000.")
    p95_ms: int | None


class HistoryOut(Schema):
    queue: str
    range: Literal["1h", "24h", "7d"]
    since: datetime | None = Field(description="When the snapshot the per-task figures start from was taken "
                                               "(near the range's start); null: no snapshot, figures are all-time.")
    step_seconds: int
    start: datetime | None
    failures: list[int | None] = Field(description="Failed runs per step, oldest first; null where unknown.")
    tasks: list[TaskFiguresOut] = Field(description="Busiest first.")
