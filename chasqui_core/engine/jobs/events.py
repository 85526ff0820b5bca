"""Job lifecycle events: in-process hooks and the per-queue events stream.

Workers write every event to a capped stream per queue (``{chasqui:<q>}:events``)
and to time-bucketed counters, inside the same Lua calls that settle jobs.
In-process subscribers get Event objects from the worker that produced them;
``read_events`` lets any process follow a queue's stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys

logger = logging.getLogger("chasqui.events")

COMPLETED = "completed"
FAILED = "failed"
RETRY_SCHEDULED = "retry_scheduled"
DLQ = "dlq"
PROMOTED = "promoted"
BATCH_SUCCEEDED = "batch_succeeded"
"""Every child of a workflow's batch succeeded (``extra``: batch; ``job_id``: its on_success's, or empty;
``count``: its children), written by the script that settled the last one (engine/flows/)."""
BATCH_COMPLETED = "batch_completed"
"""Every child of a batch ended, succeeded or not (``job_id``: its on_complete's, or empty)."""
SKIPPED = "skipped"
"""A job acknowledged without running: its idempotency key had completed (``extra``: idempotency_key,
completed_by)."""

EVENTS_MAXLEN = 10_000
"""Approximate cap of each queue's events stream."""


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    queue: str
    job_id: str = ""
    task: str = ""
    attempt: int = 0
    backoff_ms: int = 0
    duration_ms: int = 0
    error_class: str = ""
    error_message: str = ""
    reason: str = ""
    count: int = 0
    depth: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


Subscriber = Callable[[Event], None]
_subscribers: list[Subscriber] = []


def subscribe(callback: Subscriber) -> Callable[[], None]:
    """Call ``callback`` for every event this process's workers produce.

    Returns a function that unsubscribes. Callbacks run on the worker's event
    loop: keep them quick, and hand slow work to a thread or a queue.
    """
    _subscribers.append(callback)
    return lambda: _subscribers.remove(callback) if callback in _subscribers else None


def has_subscribers() -> bool:
    return bool(_subscribers)


def publish(event: Event) -> None:
    for callback in list(_subscribers):
        try:
            callback(event)
        except Exception:  # a broken hook must not break the worker
            logger.exception("event subscriber %r failed", callback)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def parse_entry(queue: str, fields: dict[bytes, bytes]) -> list[Event]:
    """Turn one events-stream entry into Event objects (a completed entry holds a batch)."""
    f = {_text(k): v for k, v in fields.items()}
    kind = _text(f.get("type", b""))
    if kind == COMPLETED:
        jobs = msgpack.unpackb(f["jobs"]) if f.get("jobs") else []
        return [Event(COMPLETED, queue, job_id=j, task=t, duration_ms=d) for j, t, d in jobs]
    if kind == SKIPPED and f.get("jobs"):  # a batch: [job id, task, idempotency key, completed by]
        return [Event(SKIPPED, queue, job_id=_text(j), task=_text(t),
                      extra={"idempotency_key": _text(k), "completed_by": _text(b)})
                for j, t, k, b in msgpack.unpackb(f["jobs"], raw=True)]
    if kind == RETRY_SCHEDULED and f.get("jobs"):  # a batch: [job id, task, attempt, backoff, duration, class, error]
        return [Event(RETRY_SCHEDULED, queue, job_id=_text(j), task=_text(t), attempt=int(a), backoff_ms=int(b),
                      duration_ms=int(d), error_class=_text(c), error_message=_text(e))
                for j, t, a, b, d, c, e in msgpack.unpackb(f["jobs"], raw=True)]
    def num(name: str) -> int:
        try:
            return int(f.get(name, 0))
        except ValueError:
            return 0
    return [
        Event(
            kind,
            queue,
            job_id=_text(f.get("job_id", b"")),
            task=_text(f.get("task", b"")),
            attempt=num("attempt"),
            backoff_ms=num("backoff_ms"),
            duration_ms=num("duration_ms"),
            error_class=_text(f.get("error_class", b"")),
            error_message=_text(f.get("error", b"")),
            reason=_text(f.get("reason", b"")),
            count=num("count"),
            depth=num("depth"),
            extra={"batch": _text(f["batch"])} if "batch" in f else {},
        )
    ]


def read_events(client: Client, queue: str, after: str = "0-0", count: int = 1000) -> tuple[str, list[Event]]:
    """Events of ``queue`` after stream id ``after``; returns (last id, events)."""
    entries = client.xrange(QueueKeys.for_queue(queue).events, min=f"({after}" if after != "0-0" else "-", count=count)
    out: list[Event] = []
    last = after
    for entry_id, fields in entries:
        last = _text(entry_id)
        out += parse_entry(queue, fields)
    return last, out
