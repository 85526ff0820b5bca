"""Background operations as operators see them: listed, followed and cancelled.

The queue's workers run them (see ``background``); this module reads the
Operation rows (brought up to date from the workers' progress in Redis first)
and asks a running one to stop.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from chasqui_core import access
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.services import background
from chasqui_core.services.audit import record
from chasqui_core.services.common import Conflict, InvalidInput, NotFound, Source, check_source, page_limit, require


def _operation(op_id: Any) -> Operation:
    try:
        pk = op_id if isinstance(op_id, uuid.UUID) else uuid.UUID(str(op_id))
        return Operation.objects.get(pk=pk)
    except (Operation.DoesNotExist, ValueError):
        raise NotFound(f"No operation {op_id!s}") from None


def get_operation(actor, op_id: Any, *, source: Source = "api") -> Operation:
    require(actor, access.VIEW, source)
    op = _operation(op_id)
    background.refresh([op])
    return op


def list_operations(
    actor, *, queue: str | None = None, status: str | None = None, limit: int = 50, source: Source = "api"
) -> list[Operation]:
    """Background operations, newest first."""
    require(actor, access.VIEW, source)
    limit = page_limit(limit)
    background.refresh_active(queue)
    qs = Operation.objects.all()
    if queue:
        qs = qs.filter(queue=queue)
    if status:
        if status not in Operation.Status.values:
            raise InvalidInput(f"Unknown status {status!r}: use one of {', '.join(Operation.Status.values)}")
        qs = qs.filter(status=status)
    ops = list(qs.select_related("created_by")[:limit])
    background.refresh(ops)
    return ops


def cancel_operation(actor, op_id: Any, *, source: Source) -> Operation:
    """Ask a background operation to stop after its current chunk (what is done stays done); one no worker
    has taken yet ends at once."""
    check_source(source)
    op = _operation(op_id)
    require(actor, access.REPLAY if op.kind == Operation.Kind.REPLAY else access.DISCARD, source)
    with transaction.atomic():
        updated = Operation.objects.filter(pk=op.pk).exclude(status__in=Operation.FINISHED).update(
            cancel_requested=True)
    op.refresh_from_db()
    if not updated:
        raise Conflict(f"Operation {op.pk} has already finished ({op.status}): there is nothing to cancel")
    background.request_cancel(op)
    record(actor, AuditEntry.Action.CANCEL_OPERATION, source=source, queue=op.queue, target_ids=[str(op.pk)],
           filter=op.filter, count=0, detail={"kind": op.kind, "done": op.done, "total": op.total})
    return op
