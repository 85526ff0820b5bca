"""The runner of replays and discards by filter that are too big to finish inside a request.

``dlq.replay``/``dlq.discard`` start them (``launch``) and ``operations``
reads, reaps and cancels them: the API, the console and the CLI go through those two.

Each runs in a thread of the process that accepted it, sweeping the DLQ one
chunk at a time through the engine (so a replay moves every entry at most
once, even beside another replay of the same entries). Progress goes to the
Operation row at most every PROGRESS_INTERVAL seconds, which is what callers
poll; a cancel request is noticed between chunks, so what is done stays done
and no entry is half-moved. The audit entry is written when the sweep ends,
with the number of entries it really touched.

An operation whose process died leaves a row marked running; once it has
shown no sign of life for STALE_AFTER it is marked failed, so nobody waits on
it and an identical one can be started again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.services.audit import record
from chasqui_core.services.common import Conflict, redis_client

logger = logging.getLogger("chasqui.operations")

PROGRESS_INTERVAL = 0.5
"""Seconds between progress writes to the database (and cancel checks of other processes)."""

STALE_AFTER = timedelta(minutes=5)

_lock = threading.Lock()
_threads: dict[uuid.UUID, threading.Thread] = {}
_cancel_events: dict[uuid.UUID, threading.Event] = {}

ACTIVE = (Operation.Status.PENDING, Operation.Status.RUNNING)


def _alive_here(op_id: uuid.UUID) -> bool:
    with _lock:
        thread = _threads.get(op_id)
    return thread is not None and thread.is_alive()


def reap_stale() -> int:
    """Mark failed the active operations whose runner is gone; returns how many."""
    cutoff = timezone.now() - STALE_AFTER
    reaped = 0
    for op in Operation.objects.filter(status__in=ACTIVE, updated_at__lt=cutoff):
        if not _alive_here(op.pk):
            reaped += Operation.objects.filter(pk=op.pk, status__in=ACTIVE).update(
                status=Operation.Status.FAILED, finished_at=timezone.now(),
                error="Stopped without finishing: the process running it ended. Entries it handled stay handled; "
                      "start the operation again to finish the rest.",
            )
    return reaped


def launch(
    actor, kind: str, queue: str, f: DLQFilter, options: dict[str, Any], source: str, *, total: int = 0
) -> Operation:
    """Record and start a background sweep; Conflict when an identical one is already running.

    ``total`` is the caller's count of matching entries, shown until the sweep counts them itself.
    """
    reap_stale()
    wanted = f.to_dict()
    for other in Operation.objects.filter(kind=kind, queue=queue, status__in=ACTIVE):
        if other.filter == wanted and other.options == options:
            raise Conflict(
                f"An identical {kind} of queue {queue!r} is already {other.status} (operation {other.pk}, "
                f"{other.done}/{other.total}): follow it, or cancel it first"
            )
    op = Operation.objects.create(
        kind=kind, queue=queue, filter=wanted, options=options, source=source, status=Operation.Status.PENDING,
        total=total, created_by=actor if actor is not None and getattr(actor, "pk", None) else None,
        updated_at=timezone.now(),
    )
    event = threading.Event()
    thread = threading.Thread(target=_run, args=(op.pk, actor, event), name=f"chasqui-op-{op.pk}", daemon=True)
    with _lock:
        _threads[op.pk] = thread
        _cancel_events[op.pk] = event
    transaction.on_commit(thread.start)  # the thread must see the committed row
    return op


def request_cancel(op_id: uuid.UUID) -> None:
    """Tell a sweep of this process to stop at once; others notice the database flag."""
    with _lock:
        event = _cancel_events.get(op_id)
    if event is not None:
        event.set()


def wait(op_id: uuid.UUID, timeout: float | None = None) -> bool:
    """Block until the operation's thread (in this process) ends; False on timeout."""
    with _lock:
        thread = _threads.get(op_id)
    if thread is None:
        return True
    if thread.ident is None:  # not started yet (waiting for the commit)
        deadline = None if timeout is None else time.monotonic() + timeout
        while thread.ident is None and thread in _threads.values():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        if deadline is not None:
            timeout = max(0.0, deadline - time.monotonic())
    thread.join(timeout)
    return not thread.is_alive()


class _Progress:
    def __init__(self, op_id: uuid.UUID) -> None:
        self.op_id = op_id
        self.done = 0
        self.total = 0
        self._last = 0.0
        self._written = False

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if not self._written or now - self._last >= PROGRESS_INTERVAL:
            self.flush()
            self._last = now

    def flush(self) -> None:
        Operation.objects.filter(pk=self.op_id).update(done=self.done, total=self.total, updated_at=timezone.now())
        self._written = True


class _StopCheck:
    def __init__(self, op_id: uuid.UUID, event: threading.Event) -> None:
        self.op_id = op_id
        self.event = event
        self.stopped = False
        self._last = 0.0

    def __call__(self) -> bool:
        if not self.stopped:
            if self.event.is_set():
                self.stopped = True
            else:
                now = time.monotonic()
                if now - self._last >= PROGRESS_INTERVAL:
                    self._last = now
                    self.stopped = Operation.objects.filter(pk=self.op_id, cancel_requested=True).exists()
        return self.stopped


def _run(op_id: uuid.UUID, actor, event: threading.Event) -> None:
    progress = _Progress(op_id)
    stop = _StopCheck(op_id, event)
    op = None
    try:
        Operation.objects.filter(pk=op_id, status=Operation.Status.PENDING).update(
            status=Operation.Status.RUNNING, updated_at=timezone.now())
        op = Operation.objects.get(pk=op_id)
        dl = DeadLetters(redis_client(), op.queue)
        f = DLQFilter.from_dict(op.filter)
        if stop():
            count = 0
        elif op.kind == Operation.Kind.REPLAY:
            count = dl.replay_matching(f, reset_attempts=op.options.get("reset_attempts", True),
                                       run_at_ms=op.options.get("run_at_ms"), progress=progress, should_stop=stop)
        else:
            count = dl.discard_matching(f, progress=progress, should_stop=stop)
        status = Operation.Status.CANCELLED if stop.stopped else Operation.Status.DONE
        _finish(op, actor, status, count, progress)
    except Exception as exc:
        logger.exception("Background %s %s failed", getattr(op, "kind", "operation"), op_id)
        if op is not None:
            _finish(op, actor, Operation.Status.FAILED, progress.done, progress,
                    error=f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        with _lock:
            _threads.pop(op_id, None)
            _cancel_events.pop(op_id, None)
        connections.close_all()


def _finish(op: Operation, actor, status: str, count: int, progress: _Progress, error: str = "") -> None:
    now = timezone.now()
    Operation.objects.filter(pk=op.pk).update(status=status, count=count, done=progress.done, total=progress.total,
                                              error=error, finished_at=now, updated_at=now)
    action = AuditEntry.Action.REPLAY if op.kind == Operation.Kind.REPLAY else AuditEntry.Action.DISCARD
    detail = {**op.options, "operation": str(op.pk), "status": status, "done": progress.done,
              "total": progress.total}
    if error:
        detail["error"] = error
    record(actor, action, source=op.source, queue=op.queue, filter=op.filter, count=count, detail=detail)
