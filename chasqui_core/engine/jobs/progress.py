"""Progress that a running job reports: a number and a short message, the latest one kept per job.

A handler that takes its context calls ``JobContext.report_progress``; the
report is only noted in memory (``report``), in the thread or task that made
it, and the worker's cancel watch (cancel.py) writes the latest report of each
job with its poll, every ``cancel.POLL_S``: one ``SET PX`` per job that
reported since, in the round trip the watch makes anyway. So a task may
report as often as it likes (in a tight loop, say) and Redis sees at most two
writes a second per job; reports in between are replaced, not queued.

The record, ``{chasqui:<q>}:progress:<job id>``, lives ``TTL_MS`` after the
last write, so it outlasts the run for a while (the job page and
``get_result()`` still show the last report of a job just finished) and
needs no cleanup. A report made just before the run ends may be lost with a
worker that dies: progress is a hint for people watching, never a state
anything depends on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.store.keys import QueueKeys

TTL_MS = 24 * 3600 * 1000
"""How long a job's last report is kept after it was written."""

MESSAGE_MAX = 200
"""Characters of a report's message kept; the rest is cut off."""

_pending: dict[str, dict[tuple[str, str], tuple[float, str, int]]] = {}
"""Reports not yet written, per worker id: (queue, job id) -> (value, message, ms). Written from job threads and
tasks, taken by the worker's loop; a report that lands in a dict just taken waits for the next poll."""


@dataclass(frozen=True, slots=True)
class Progress:
    """The latest progress a job reported."""

    value: float
    message: str
    at_ms: int
    """When the job reported it (the worker's clock)."""


def check(value: Any, message: Any) -> tuple[float, str]:
    """The report as stored, or ValueError / TypeError saying what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"progress must be a finite number (a percentage, or items done), got {value!r}")
    if not isinstance(message, str):
        raise TypeError(f"the progress message must be a string, got {type(message).__name__}")
    return float(value), message[:MESSAGE_MAX]


def report(worker_id: str, queue: str, job_id: str, value: Any, message: Any = "") -> None:
    """Note a job's progress, to be written with the worker's next poll (cheap: a dict assignment)."""
    checked, text = check(value, message)
    reports = _pending.get(worker_id)
    if reports is None:
        reports = _pending.setdefault(worker_id, {})
    reports[(queue, job_id)] = (checked, text, now_ms())


def waiting(worker_id: str) -> bool:
    """Whether reports of this worker's jobs wait to be written."""
    return bool(_pending.get(worker_id))


def take(worker_id: str) -> dict[tuple[str, str], tuple[float, str, int]]:
    """The reports noted since the last call, latest per job."""
    reports = _pending.get(worker_id)
    if not reports:
        return {}
    _pending[worker_id] = {}
    return reports


def forget(worker_id: str) -> None:
    """Drop a stopped worker's unwritten reports."""
    _pending.pop(worker_id, None)


def encode(value: float, message: str, at_ms: int) -> bytes:
    blob: bytes = msgpack.packb({"value": value, "message": message, "at": at_ms})
    return blob


def decode(blob: bytes | None) -> Progress | None:
    if not blob:
        return None
    try:
        data = msgpack.unpackb(blob)
        return Progress(float(data["value"]), str(data.get("message", "")), int(data.get("at", 0)))
    except Exception:  # not a record this module wrote: show nothing rather than fail a page
        return None


def read(client: Client, queue: str, job_id: str) -> Progress | None:
    """A job's latest report, or None (never reported, or long gone)."""
    return decode(client.get(QueueKeys.for_queue(queue).progress + job_id))
