"""Background operations: big replays and discards by filter."""

import uuid
from typing import Literal

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import CHANGE, READ
from .dlq_schemas import OperationListOut, OperationOut
from chasqui_core.services import operations as operations_service
from chasqui_core.services.common import MAX_PAGE

router = Router(tags=["operations"])


@router.get("", response={200: OperationListOut, **READ}, summary="List background operations",
            auth=needs("view_queues"))
def list_operations(
    request: HttpRequest,
    queue: str | None = Query(None, max_length=100),
    status: Literal["pending", "running", "done", "cancelled", "failed"] | None = Query(None),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
):
    """Newest first. Needs view_queues."""
    ops = operations_service.list_operations(request.auth, queue=queue, status=status, limit=limit)
    return OperationListOut(items=[OperationOut.from_op(op) for op in ops])


@router.get("/{op_id}", response={200: OperationOut, **READ}, summary="One operation and its progress",
            auth=needs("view_queues"))
def get_operation(request: HttpRequest, op_id: uuid.UUID):
    """Poll ``done``/``total`` until ``status`` is done, cancelled or failed. Needs view_queues."""
    return OperationOut.from_op(operations_service.get_operation(request.auth, op_id))


@router.post("/{op_id}/cancel", response={200: OperationOut, **CHANGE}, summary="Cancel an operation",
             auth=needs(("replay_jobs", "discard_jobs")))
def cancel_operation(request: HttpRequest, op_id: uuid.UUID):
    """Stops after the current chunk: entries handled stay handled, none is half-moved. 409 when the
    operation already finished. Needs replay_jobs or discard_jobs, as the operation's kind."""
    return OperationOut.from_op(operations_service.cancel_operation(request.auth, op_id, source="api"))
