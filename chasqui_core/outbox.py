"""The transactional outbox: enqueues that commit with the caller's data.

``transaction.on_commit`` alone loses a job when Redis is unreachable at the
moment of the commit: the data is saved, the job is not. With the backend's
``OUTBOX`` option, an enqueue inside ``transaction.atomic()`` writes an
``OutboxEntry`` row in the caller's own transaction instead. After the commit
the row is relayed to Redis at once; when that fails, the relay that every
worker runs (``OutboxRelay``) retries until Redis answers. The job id is the
idempotency key, so a row relayed twice still adds the job once.
"""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections, connection, transaction

from chasqui_core.models import OutboxEntry

logger = logging.getLogger("chasqui.outbox")

RELAY_BATCH = 500


def relay(ids: list[int] | None = None, *, limit: int = RELAY_BATCH) -> int:
    """Send committed outbox rows to Redis and delete them; returns how many were sent.

    ``ids`` limits the relay to given rows (the on-commit fast path); None
    takes the oldest rows. On PostgreSQL concurrent relays skip each other's
    rows (SKIP LOCKED); elsewhere a row sent twice is harmless.
    """
    from django.tasks import task_backends

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
        backend = _backend(task_backends)
        sent: list[int] = []
        failed: list[tuple[list[OutboxEntry], Exception]] = []
        for queue_name, group in by_queue.items():
            try:
                backend.queue(queue_name).add_encoded([(r.job_id, r.when, bytes(r.payload)) for r in group])
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


def _backend(task_backends):
    from chasqui_core.backend import ChasquiBackend

    for backend in task_backends.all():
        if isinstance(backend, ChasquiBackend):
            return backend
    raise LookupError("no ChasquiBackend configured in settings.TASKS")


def relay_after_commit(row_ids: list[int]) -> None:
    """The fast path: try to send rows as soon as their transaction commits."""
    try:
        for start in range(0, len(row_ids), RELAY_BATCH):
            relay(row_ids[start:start + RELAY_BATCH])
    except Exception:
        logger.warning("outbox: relaying %d job row(s) after commit failed; the relay will retry", len(row_ids),
                       exc_info=True)


class OutboxRelay:
    """A thread that relays leftover outbox rows, run inside every worker."""

    def __init__(self, interval: float = 1.0) -> None:
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
                while relay() == RELAY_BATCH and not self._stop.is_set():
                    pass
            except Exception:
                logger.warning("outbox relay round failed; retrying", exc_info=True)
            finally:
                close_old_connections()
            self._stop.wait(self.interval)
