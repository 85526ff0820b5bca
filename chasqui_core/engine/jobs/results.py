"""Stored outcomes of jobs, for ``get_result()`` when result storage is on.

One record per job under ``{chasqui:<q>}:result:<job id>``, with a TTL: the
producer writes it READY at enqueue, the worker rewrites it after each run
(READY again while retries remain, then SUCCESSFUL or FAILED). Both sides
build it here, so the reader sees one shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack


def encode_result(
    *,
    job_id: str,
    task: str,
    status: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    enqueued_at: int,
    errors: Sequence[dict[str, Any]] = (),
    started_at: int | None = None,
    finished_at: int | None = None,
    worker: str = "",
    return_value: Any = None,
    duplicate_of: str | None = None,
) -> bytes:
    """``duplicate_of``: the job whose success made this one's run unnecessary (execution idempotency)."""
    record = {
        "id": job_id, "task": task, "status": status, "args": list(args), "kwargs": kwargs,
        "enqueued_at": enqueued_at, "started_at": started_at, "finished_at": finished_at,
        "last_attempted_at": started_at, "errors": list(errors), "worker": worker, "return_value": return_value,
    }
    if duplicate_of is not None:
        record["duplicate_of"] = duplicate_of
    blob: bytes = msgpack.packb(record)
    return blob


def decode_result(blob: bytes) -> dict[str, Any]:
    record: dict[str, Any] = msgpack.unpackb(blob)
    return record
