"""Execution idempotency: a job whose key has already completed is acknowledged, not run again.

A producer gives a job an idempotency key (``Queue.add(..., idempotency_key=
"invoice-42")``, or ``idempotency_key=True`` for the job's own id; in Django
``task.using(idempotency_key=...)``). The key rides in the envelope's meta with
the lifetime of its marker, and is covered by the job's signature.

When a keyed job succeeds, ``settle.lua`` sets ``<done><key>`` to the job's
id, with that lifetime, in the same call that acknowledges the job: a marker
exists once a run under that key has succeeded and been acknowledged. Before
it runs keyed jobs, the worker reads the markers of a fetched batch's keyed
jobs with one MGET (a batch without a keyed job costs nothing more); a job
whose key is marked is acknowledged without running, counted (``skipped``),
written to the events stream and logged.

This catches a copy of a job that already succeeded: added twice (a caller
retrying with a new id, or after the enqueue-time window of ``job_id``),
replayed from the dead-letter queue after another copy succeeded, or
redelivered after a worker died. It does not catch:

* two copies that start before either has finished: the check is made when a
  batch is fetched, so it is not a lock;
* a run whose success was never settled (the worker died between the
  handler's return and its settle, a few milliseconds): there is no marker,
  and the job runs again. Delivery stays at-least-once; a side effect that
  must happen once needs its own guard where it happens (a unique row in the
  same database transaction);
* a marker past its lifetime, or lost with Redis's data;
* copies on different queues: markers are per queue.
"""

from __future__ import annotations

from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.jobs.envelope import DecodeError, Job

IDEMPOTENCY_KEY = "idempotency_key"
"""The key of a job's idempotency key in its ``meta``."""
IDEMPOTENCY_TTL = "idempotency_ttl"
"""The key of its marker's lifetime, in seconds, in its ``meta``."""

DEFAULT_TTL = 24 * 3600
"""Seconds a completed key is remembered unless the job says otherwise."""
MAX_TTL = 366 * 24 * 3600
MAX_KEY_LENGTH = 200


def check_key(key: Any) -> str:
    if type(key) is not str or not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"idempotency_key must be True (the job's id) or a non-empty string of at most "
                         f"{MAX_KEY_LENGTH} characters, got {key!r:.80}")
    return key


def check_ttl(ttl: Any, where: str = "idempotency_ttl") -> int:
    if type(ttl) is not int or not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"{where} must be a whole number of seconds from 1 to {MAX_TTL}, got {ttl!r:.50}")
    return ttl


def key_of(job: Job) -> str | None:
    """The job's idempotency key, None when it has none; DecodeError when it is not a usable one."""
    key = job.meta.get(IDEMPOTENCY_KEY)
    if key is None:
        return None
    if type(key) is not str or not key or len(key) > MAX_KEY_LENGTH:
        raise DecodeError(f"malformed envelope: meta[{IDEMPOTENCY_KEY!r}] must be a non-empty string of at most "
                          f"{MAX_KEY_LENGTH} characters, got {key!r:.50}")
    return key


def ttl_ms(job: Job) -> int:
    """Milliseconds to keep the job's marker: its own lifetime, or the default when it carries none usable."""
    ttl = job.meta.get(IDEMPOTENCY_TTL)
    if type(ttl) is not int or not 1 <= ttl <= MAX_TTL:
        ttl = DEFAULT_TTL
    return ttl * 1000


async def completed_by(client: Client, markers: list[str]) -> list[str | None]:
    """For each marker key, the id of the job that completed it, or None: one round trip."""
    replies = await client.mget(markers)
    return [reply.decode(errors="replace") if isinstance(reply, bytes) else reply for reply in replies]
