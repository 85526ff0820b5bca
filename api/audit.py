"""The audit log: every change made through the API, the console or the CLI."""

from django.http import HttpRequest
from ninja import Query, Router

from .auth import needs
from .errors import READ
from .schemas import AuditOut, AuditPageOut, AuditQuery
from chasqui_core.services import audit as audit_service

router = Router(tags=["audit"])


@router.get("", response={200: AuditPageOut, **READ}, summary="List audit entries", auth=needs("view_queues"))
def list_audit(request: HttpRequest, q: Query[AuditQuery]):
    """Newest first, filtered by action, queue, actor, source and time. Needs view_queues."""
    page = audit_service.audit_log(request.auth, action=q.action, queue=q.queue, actor_name=q.actor,
                                   source_filter=q.source, since=q.since, until=q.until, cursor=q.cursor, limit=q.limit)
    return AuditPageOut(items=[AuditOut.from_entry(e) for e in page.items], next_cursor=page.next_cursor)
