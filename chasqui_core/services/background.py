"""Replays and discards by filter too big to finish inside a request, run by the queue's workers.

``dlq.replay``/``dlq.discard`` start them (``launch``) and ``operations``
reads and cancels them: the API, the console and the CLI go through those two.

The web process never runs a sweep. ``launch`` writes two records: the
Operation row, the lasting one operators list and the audit log points to,
and the engine's record in Redis (``engine/dlq/operations.py``), which a
worker of the queue claims and sweeps, writing its progress there after
every chunk. A worker that dies mid-way is taken over by another one from
where it stopped; a web restart changes nothing.

``refresh`` copies the Redis record's progress onto the rows (every read of
an operation does, and the console's live page each second). The first
refresh that sees an operation ended writes its audit entry, with the number
of entries it really touched: one conditional update decides who writes it,
so it is written once.

With no worker serving the queue an operation waits, and says so
(``waiting_for_worker``); ``run_pending`` runs pending operations in the
calling process instead (``manage.py chasqui_operations``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.operations import Operations, OperationRecord
from chasqui_core.engine.dlq.operations import run_pending as run_engine_pending
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.ops.stats import workers as worker_beats
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.services.audit import record
from chasqui_core.services.common import Conflict, redis_client

logger = logging.getLogger("chasqui.operations")

LOST_AFTER = timedelta(minutes=2)
"""An active row whose Redis record is missing this long after it was started is marked failed (Redis lost it)."""

ACTIVE = (Operation.Status.PENDING, Operation.Status.RUNNING)


def launch(
    actor, kind: str, queue: str, f: DLQFilter, options: dict[str, Any], source: str, *, total: int = 0,
    total_exact: bool = False,
) -> Operation:
    """Record an operation for the queue's workers; Conflict when an identical one is still under way.

    ``total`` is the caller's count (or estimate) of matching entries, shown until the sweep ends.
    """
    wanted = f.to_dict()
    active = list(Operation.objects.filter(kind=kind, queue=queue, status__in=ACTIVE))
    refresh(active)
    for other in active:
        if other.status in ACTIVE and other.filter == wanted and other.options == options:
            raise Conflict(
                f"An identical {kind} of queue {queue!r} is already {other.status} (operation {other.pk}, "
                f"{other.done}/{other.total}): follow it, or cancel it first"
            )
    op = Operation.objects.create(
        kind=kind, queue=queue, filter=wanted, options=options, source=source, status=Operation.Status.PENDING,
        total=total, created_by=actor if actor is not None and getattr(actor, "pk", None) else None,
        updated_at=timezone.now(),
    )
    try:
        Operations(redis_client(), queue).submit(
            str(op.pk), kind, f, reset_attempts=options.get("reset_attempts", True),
            run_at_ms=options.get("run_at_ms"), rate=options.get("rate"), total=total, total_exact=total_exact,
        )
    except Exception:
        op.delete()
        raise
    op.total_exact, op.rate, op.waiting_for_worker = total_exact, options.get("rate"), False
    return op


def _record_of(raw: dict[bytes, bytes], op: Operation) -> OperationRecord | None:
    return OperationRecord.parse(str(op.pk), op.queue, raw) if raw else None


def _ms_time(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms else None


def refresh(ops: Iterable[Operation]) -> None:
    """Bring the rows of unfinished operations up to date from Redis (in place), writing the audit entry of
    those that ended. Each row also gets ``total_exact``, ``rate`` and ``waiting_for_worker`` to show."""
    ops = list(ops)
    for op in ops:
        op.total_exact = op.status not in ACTIVE
        op.rate = (op.options or {}).get("rate")
        op.waiting_for_worker = False
    active = [op for op in ops if op.status in ACTIVE]
    if not active:
        return
    client = redis_client()
    pipe = client.pipeline(transaction=False)
    for op in active:
        pipe.hgetall(QueueKeys.for_queue(op.queue).operation(str(op.pk)))
    raws = pipe.execute()
    now = timezone.now()
    served: dict[str, bool] = {}
    for op, raw in zip(active, raws, strict=True):
        rec = _record_of(raw, op)
        if rec is None:
            if op.created_at is not None and now - op.created_at > LOST_AFTER:
                _finish(op, Operation.Status.FAILED, op.done, op.total, op.done,
                        "Its progress record is gone from Redis (Redis was emptied, or restarted without keeping "
                        "its data). Entries it handled stay handled; start it again to finish the rest.", now)
            continue
        op.total_exact = rec.total_exact
        if rec.cancel:
            op.cancel_requested = True
        if rec.finished:
            _finish(op, rec.state, rec.done, rec.total, rec.count, rec.error, _ms_time(rec.finished_ms) or now)
            continue
        op.status, op.done, op.total, op.count, op.updated_at = rec.state, rec.done, rec.total, rec.count, now
        Operation.objects.filter(pk=op.pk, status__in=ACTIVE).update(
            status=op.status, done=op.done, total=op.total, count=op.count, updated_at=now,
            cancel_requested=op.cancel_requested)
        if rec.state == "pending":
            if op.queue not in served:
                served[op.queue] = any(not w.stale for w in worker_beats(client, op.queue))
            op.waiting_for_worker = not served[op.queue]


def _finish(op: Operation, status: str, done: int, total: int, count: int, error: str, when: datetime) -> None:
    updated = Operation.objects.filter(pk=op.pk, status__in=ACTIVE).update(
        status=status, done=done, total=total, count=count, error=error, finished_at=when, updated_at=when)
    op.refresh_from_db()
    op.total_exact, op.rate, op.waiting_for_worker = True, (op.options or {}).get("rate"), False
    if not updated:
        return  # someone else saw it end first and wrote the audit entry
    action = AuditEntry.Action.REPLAY if op.kind == Operation.Kind.REPLAY else AuditEntry.Action.DISCARD
    detail = {**op.options, "operation": str(op.pk), "status": status, "done": done, "total": total}
    if error:
        detail["error"] = error
    record(op.created_by, action, source=op.source, queue=op.queue, filter=op.filter, count=count, detail=detail)


def refresh_active(queue: str | None = None) -> list[Operation]:
    """Refresh every unfinished operation (of one queue); returns them."""
    qs = Operation.objects.filter(status__in=ACTIVE)
    if queue:
        qs = qs.filter(queue=queue)
    ops = list(qs)
    refresh(ops)
    return ops


class OperationAudits:
    """A thread of ``runworker`` that refreshes the unfinished operations of its queues every few seconds, so
    each one's audit entry is written soon after it ends even if nobody looks at it."""

    EVERY_S = 2.0

    def __init__(self, queues: Iterable[str]) -> None:
        self.queues = list(queues)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chasqui-operation-audits", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from django.db import close_old_connections

        while not self._stop.wait(self.EVERY_S):
            try:
                refresh(Operation.objects.filter(status__in=ACTIVE, queue__in=self.queues))
            except Exception as exc:  # the database or Redis is away: try again at the next turn
                logger.warning("refreshing DLQ operations: %s: %s", type(exc).__name__, exc)
            finally:
                close_old_connections()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def request_cancel(op: Operation) -> None:
    """Ask the runner to stop after its chunk; one nobody runs yet ends now."""
    Operations(redis_client(), op.queue).cancel(str(op.pk))
    refresh([op])


def run_pending(queue: str | None = None, *, should_stop: Callable[[], bool] | None = None) -> list[Operation]:
    """Run the pending operations (of one queue, or of every queue with one) in this process, to their end.

    For when no worker serves a queue; a worker of the queue would take them otherwise. Returns the rows.
    """
    queues = [queue] if queue else sorted(set(Operation.objects.filter(status__in=ACTIVE)
                                              .values_list("queue", flat=True)))
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    client = redis_client()
    ran: list[str] = []
    for q in queues:
        ran += [r.id for r in run_engine_pending(client, q, owner, should_stop=should_stop)]
    ops = list(Operation.objects.filter(pk__in=ran))
    refresh(ops)
    return ops
