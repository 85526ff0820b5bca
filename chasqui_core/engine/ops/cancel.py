"""Cancelling a job by id, wherever it is: waiting, delayed or running.

A cancel request is a field of the queue's cancel record
(``{chasqui:<q>}:cancel``, a hash job id -> requested ms), written by
``request`` with ``cancel.lua``. A delayed job found in the delayed set is
moved to the stream in the same call, so it is settled at once rather than at
its due time. Workers act on the record in two places:

- **At pickup.** Each XREADGROUP is sent with a ``GET`` of the record's
  version (``{chasqui:<q>}:cancel:v``, bumped by every change to the record)
  in the same round trip (reader.py): the server runs it right after the
  read, so a request written before an entry was delivered is seen. The
  worker keeps a copy of the record per version (``Copies``) and checks the
  batch's job ids against it in memory; only a new version costs a read of
  the record. A job named there is not run. A queue nobody cancels in pays
  one tiny command per batch read, and a record that stays non-empty one
  dict lookup per job.
- **While held.** ``cancel_watch.Watch`` polls the record every ``POLL_S`` for the jobs
  the worker holds (one ``HMGET`` per queue, pipelined, and only while it
  holds any). A job still waiting in the worker is settled without running;
  a running async job is cancelled (``asyncio.Task.cancel``); a running sync
  job is told (``JobContext.cancelled``), and once ``grace`` seconds have
  passed it is given up like a job past its timeout: its outcome is written
  and its thread abandoned (or the process recycled, under a supervisor).

A cancelled job is dead-lettered with reason ``cancelled`` (not counted as a
failure, never retried; its stored result says FAILED with a
``JobCancelled`` error), where it can be looked at, replayed or discarded,
as Oban keeps a cancelled job and Celery a revoked one. A run that finishes
despite the request (it returned before the worker acted, or a sync job
that ignored the flag and returned within the grace) keeps its success.

Once a cancelled job's outcome is written, the watch removes its field from
the record. Fields whose job never came (it had finished already) are swept
after ``KEEP_MS``; see docs/flow-control.md for what that bounds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import Scripts

logger = logging.getLogger("chasqui.worker")

POLL_S = 0.5
"""How often a worker holding jobs reads the cancel records (and writes the progress its jobs reported)."""

DEFAULT_GRACE_S = 10.0
"""How long a running sync job, once told, may go on before it is given up like a job past its timeout."""

KEEP_MS = 7 * 24 * 3600 * 1000
"""A request no worker acted on (its job had finished, say) is swept this long after it was made."""

SWEEP_EVERY_S = 300.0
"""How often each worker sweeps old requests out of its queues' records."""


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """What a cancel call did."""

    job_id: str
    queue: str
    requested_ms: int
    """Server time of the request."""
    moved_from_delayed: bool
    """The job was in the delayed set and went to the stream, to be settled as cancelled by the next worker."""


def request(client: Client, queue: str, job_id: str, delayed_member: bytes | None = None) -> CancelRequest:
    """Ask for ``job_id`` on ``queue`` to be cancelled; ``delayed_member``: its member in the delayed set, when
    it was found there (delayed.find), so that it leaves the set at once. Safe to repeat."""
    keys = QueueKeys.for_queue(queue)
    now, how = Scripts(client).cancel(keys=[keys.cancel, keys.delayed, keys.stream, keys.cancel_version],
                                      args=[job_id, delayed_member or b""])
    moved = (how.decode() if isinstance(how, bytes) else str(how)) == "delayed"
    return CancelRequest(job_id, queue, int(now), moved)


def requested_ms(client: Client, queue: str, job_id: str) -> int | None:
    """When a cancel of the job was asked for, while its request is on record; None otherwise."""
    raw = client.hget(QueueKeys.for_queue(queue).cancel, job_id)
    return int(raw) if raw is not None else None


UNKNOWN = b"?"
"""The version to pass ``Copies.of`` when it was not read with the entries: the record is read afresh."""


class Copies:
    """A worker's copies of its queues' cancel records, one per record version.

    The reader reads the record's version with every XREADGROUP (in the same
    round trip); while it is the one copied, the batch is checked against the
    copy in memory, and only a new version costs a read of the record. A
    version of None means no request was ever made on the queue.
    """

    def __init__(self) -> None:
        self._copies: dict[str, tuple[bytes, dict[str, int]]] = {}

    async def of(self, client: Client, keys: QueueKeys, version: bytes) -> dict[str, int]:
        """The record (job id -> requested ms) as of ``version`` or later."""
        copy = self._copies.get(keys.queue)
        if copy is not None and copy[0] == version and version is not UNKNOWN:
            return copy[1]
        raw = await client.hgetall(keys.cancel)
        record = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
        if version is not UNKNOWN:
            self._copies[keys.queue] = (version, record)
        return record


def describe(requested: int, *, running: bool) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(requested / 1000))
    return f"cancelled {'while it ran' if running else 'before it started'} (requested at {when} UTC)"
