"""The transactional outbox: enqueues that commit with the caller's data.

``transaction.on_commit`` alone loses a job when Redis is unreachable at the
moment of the commit: the data is saved, the job is not. With the backend's
``OUTBOX`` option, an enqueue inside ``transaction.atomic()`` is staged here
instead: ``stage`` writes an ``OutboxEntry`` row per job in the caller's own
transaction. After the commit the rows are relayed to Redis at once; when
that fails, the relay that every worker runs (``OutboxRelay``) retries until
Redis answers. The job id is the idempotency key, so a row relayed twice
still adds the job once.

The backend calls this module and never the other way round: whoever relays
passes the way to reach Redis (``queue_for``, the backend's ``queue`` method).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django.apps import apps
from django.db import close_old_connections, connection, transaction

from chasqui_core.engine.flows import batches
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.producer.queue import Queue

if TYPE_CHECKING:
    from chasqui_core.models import OutboxEntry

logger = logging.getLogger("chasqui.outbox")

RELAY_BATCH = 500

QueueFor = Callable[[str], Queue]
"""The Queue that sends a queue's jobs to Redis, by queue name."""

WORKFLOW = "flow"
"""A row's ``when`` for a workflow's start (chasqui_core/flows.py): its payload is the whole start call, its
``job_id`` the workflow's id."""

BuiltJob = tuple[str, str, bytes, str]
"""A job as ``Queue.build`` returns it: (caller's job id or "", when, payload, job id)."""


def _entries() -> type[OutboxEntry]:
    """The OutboxEntry model, looked up when used rather than imported.

    The backend imports this module, and Django may load the backend before
    the app registry is ready (a tasks module imported from settings or from
    an app's config), when no model can be imported yet.
    """
    return apps.get_model("chasqui_core", "OutboxEntry")


def stage(queue_name: str, built: Sequence[BuiltJob], *, queue_for: QueueFor,
          after_commit: Callable[[bool], None]) -> None:
    """Write the jobs as outbox rows in the caller's transaction, and relay them once it commits.

    ``queue_for`` gives the queues of that one relay attempt: they should try
    once and not wait out an outage, since the rows already hold the jobs and
    the workers' relay sends what this attempt could not. ``after_commit``
    runs after it, whether or not Redis answered, told whether every job
    reached Redis: the jobs are safe in the database either way, so nothing
    here raises into the code that committed.
    """
    OutboxEntry = _entries()
    now = now_ms()
    rows = []
    for _, when, payload, job_id in built:
        if when.startswith("+"):  # relative delays count from now, not from the relay
            when = "@" + str(now + int(when[1:]))
        rows.append(OutboxEntry(queue=queue_name, job_id=job_id, payload=payload, when=when))
    if len(rows) == 1:
        rows[0].save(force_insert=True)
    else:
        rows = OutboxEntry.objects.bulk_create(rows)
    ids = [row.id for row in rows]
    if None in ids:  # a database that does not return ids from bulk inserts
        ids = list(OutboxEntry.objects.filter(job_id__in=[b.job_id for b in built]).values_list("id", flat=True))

    def relay_now() -> None:
        after_commit(_relay_after_commit(ids, queue_for))

    transaction.on_commit(relay_now)


def stage_workflow(queue_name: str, workflow_id: str, encoded: bytes, *, queue_for: QueueFor) -> None:
    """Write a workflow's start (``batches.encode_start``) as one row in the caller's transaction, relayed once it
    commits; ``flow_start.lua`` ignores a start it applied before, so a row relayed twice starts it once."""
    row = _entries()(queue=queue_name, job_id=workflow_id, payload=encoded, when=WORKFLOW)
    row.save(force_insert=True)
    ids = [row.id]
    transaction.on_commit(lambda: _relay_after_commit(ids, queue_for))


def _send(queue: Queue, rows: list[OutboxEntry]) -> None:
    """Jobs in one call per chunk; each workflow's start in its own (atomic) call."""
    jobs = [(r.job_id, r.when, bytes(r.payload)) for r in rows if r.when != WORKFLOW]
    if jobs:
        queue.add_encoded(jobs)
    for r in rows:
        if r.when == WORKFLOW:
            batches.start_encoded(queue.redis, queue.keys, bytes(r.payload))


def relay(queue_for: QueueFor, ids: list[int] | None = None, *, limit: int = RELAY_BATCH) -> int:
    """Send committed outbox rows to Redis and delete them; returns how many were sent.

    ``ids`` limits the relay to given rows (the on-commit fast path); None
    takes the oldest rows. On PostgreSQL concurrent relays skip each other's
    rows (SKIP LOCKED); elsewhere a row sent twice is harmless.
    """
    OutboxEntry = _entries()
    with transaction.atomic():
        rows = OutboxEntry.objects.order_by("id")
        if ids is not None:
            rows = rows.filter(id__in=ids)
        if connection.features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True)
        rows = list(rows[:limit])
        if not rows:
            return 0
        by_queue: dict[str, list[OutboxEntry]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        sent: list[int] = []
        failed: list[tuple[list[OutboxEntry], Exception]] = []
        for queue_name, group in by_queue.items():
            try:
                _send(queue_for(queue_name), group)
            except Exception as exc:  # Redis down: keep the rows for the next round
                failed.append((group, exc))
            else:
                sent += [r.id for r in group]
        if sent:
            OutboxEntry.objects.filter(id__in=sent).delete()
        for group, exc in failed:
            for row in group:
                row.attempts += 1
                row.last_error = f"{type(exc).__name__}: {exc}"[:1000]
            OutboxEntry.objects.bulk_update(group, ["attempts", "last_error"])
            logger.warning("outbox: %d job(s) for %s not relayed yet (%s); will retry", len(group),
                           group[0].queue, exc)
    return len(sent)


def _relay_after_commit(row_ids: list[int], queue_for: QueueFor) -> bool:
    """The fast path: try to send rows as soon as their transaction commits; True when all of them went."""
    sent = 0
    try:
        for start in range(0, len(row_ids), RELAY_BATCH):
            sent += relay(queue_for, row_ids[start:start + RELAY_BATCH])
    except Exception:
        logger.warning("outbox: relaying %d job row(s) after commit failed; the relay will retry", len(row_ids),
                       exc_info=True)
        return False
    return sent == len(row_ids)


class OutboxRelay:
    """A thread that relays leftover outbox rows, run inside every worker."""

    def __init__(self, queue_for: QueueFor, interval: float = 1.0) -> None:
        self.queue_for = queue_for
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chasqui-outbox", daemon=True)

    def start(self) -> OutboxRelay:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                close_old_connections()
                while relay(self.queue_for) == RELAY_BATCH and not self._stop.is_set():
                    pass
            except Exception:
                logger.warning("outbox relay round failed; retrying", exc_info=True)
            finally:
                close_old_connections()
            self._stop.wait(self.interval)
