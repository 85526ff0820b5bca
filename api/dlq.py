"""The dead-letter queue: browse, group, replay and discard."""

from django.http import HttpRequest
from ninja import Query, Router
from ninja.responses import Status

from .auth import needs
from .errors import CHANGE, READ, WITH_BODY
from .dlq_schemas import (
    BulkIn,
    BulkOut,
    DeadJobOut,
    DeadJobSummaryOut,
    DLQPageOut,
    DLQPageQuery,
    DLQQuery,
    DLQSearchOut,
    DLQSearchQuery,
    ErrorGroupOut,
    GroupsOut,
    OneReplayIn,
    OperationOut,
    ReplayIn,
)
from .schemas import EntryId, QueueName
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.models import Operation
from chasqui_core.services import dlq as dlq_service
from chasqui_core.services.common import NotFound, require

router = Router(tags=["dlq"])


def _filter(q: DLQQuery) -> DLQFilter:
    return dlq_service.build_filter(task=q.task, reason=q.reason, error_class=q.error_class, error_text=q.error_text,
                                    fingerprint=q.fingerprint, since=q.since, until=q.until)


def _bulk_response(result: int | Operation):
    if isinstance(result, Operation):
        return Status(202, BulkOut(background=True, count=None, operation=OperationOut.from_op(result)))
    return Status(200, BulkOut(background=False, count=result, operation=None))


@router.get("/{queue}/dlq", response={200: DLQPageOut, **READ}, summary="Page through dead jobs",
            auth=needs("view_queues"))
def list_dead(request: HttpRequest, queue: QueueName, q: Query[DLQPageQuery]):
    """Newest first, filtered by task, reason, error class, error text, error group (``fingerprint``) and
    time range; pass ``next_cursor`` back as ``cursor`` for older entries. Needs view_queues."""
    page = dlq_service.dlq_page(request.auth, queue, filter=_filter(q), cursor=q.cursor, limit=q.limit)
    return DLQPageOut(items=[DeadJobSummaryOut.from_dead(d) for d in page.items], next_cursor=page.next_cursor,
                      scanned=page.scanned)


@router.get("/{queue}/dlq/groups", response={200: GroupsOut, **READ}, summary="Dead jobs grouped by error",
            auth=needs("view_queues"))
def dead_groups(request: HttpRequest, queue: QueueName, q: Query[DLQQuery]):
    """Groups by fingerprint (exception class + message with ids and numbers normalised), with count and
    first/last seen, biggest first. Over the whole DLQ (or a time range of it) the DLQ's index answers: the 200
    biggest groups, and `other_entries` in the rest, so the counts add up. Other filters group the newest
    100,000 matching entries (`whole` is false). Needs view_queues."""
    grouping = dlq_service.dlq_grouping(request.auth, queue, filter=_filter(q))
    return GroupsOut(items=[ErrorGroupOut.from_group(g) for g in grouping.groups], whole=grouping.whole,
                     total_groups=grouping.total_groups, other_entries=grouping.other_entries)


@router.post("/{queue}/dlq/replay", response={200: BulkOut, 202: BulkOut, **WITH_BODY},
             summary="Replay dead jobs by ids or by filter", auth=needs("replay_jobs"))
def replay(request: HttpRequest, queue: QueueName, payload: ReplayIn):
    """Give ``ids`` or a ``filter`` (``{"fingerprint": ...}`` is one error group). Filters matching more
    than a few thousand entries run in the background: the answer is 202 with an operation to poll at
    /api/operations/{id}. Needs replay_jobs."""
    result = dlq_service.replay(
        request.auth, queue, ids=payload.ids,
        filter=_filter(payload.filter) if payload.filter is not None else None,
        reset_attempts=payload.reset_attempts, run_at=payload.run_at, rate=payload.rate, source="api",
    )
    return _bulk_response(result)


@router.post("/{queue}/dlq/discard", response={200: BulkOut, 202: BulkOut, **WITH_BODY},
             summary="Discard dead jobs by ids or by filter", auth=needs("discard_jobs"))
def discard(request: HttpRequest, queue: QueueName, payload: BulkIn):
    """Delete for good. Same ``ids``/``filter`` rules and background behaviour as replay.
    Needs discard_jobs."""
    result = dlq_service.discard(
        request.auth, queue, ids=payload.ids,
        filter=_filter(payload.filter) if payload.filter is not None else None, source="api",
    )
    return _bulk_response(result)


@router.get("/{queue}/dlq/search", response={200: DLQSearchOut, **READ}, summary="Search every dead job for text",
            auth=needs("view_queues"))
def search_dead(request: HttpRequest, queue: QueueName, q: Query[DLQSearchQuery]):
    """Entries whose job id, task, error or arguments hold ``q`` (case-insensitive, secrets masked first),
    newest first. One request reads for about half a second (hundreds of thousands of entries); while
    ``next_cursor`` is not null, pass it back as ``cursor`` to search further. Needs view_queues."""
    page = dlq_service.dlq_search(request.auth, queue, q.q, cursor=q.cursor, limit=q.limit)
    return DLQSearchOut(items=[DeadJobSummaryOut.from_dead(d) for d in page.items], next_cursor=page.next_cursor,
                        scanned=page.scanned, total=page.total)


@router.get("/{queue}/dlq/{entry_id}", response={200: DeadJobOut, **READ}, summary="One dead job",
            auth=needs("view_queues"))
def get_dead(request: HttpRequest, queue: QueueName, entry_id: EntryId):
    """The entry with its arguments and whole error history (tracebacks included). Needs view_queues."""
    return DeadJobOut.from_dead(dlq_service.dlq_entry(request.auth, queue, entry_id))


@router.post("/{queue}/dlq/{entry_id}/replay", response={200: BulkOut, **WITH_BODY}, summary="Replay one dead job",
             auth=needs("replay_jobs"))
def replay_one(request: HttpRequest, queue: QueueName, entry_id: EntryId, payload: OneReplayIn | None = None):
    """404 when the entry is gone (replayed or discarded already). Needs replay_jobs."""
    options = payload or OneReplayIn()
    require(request.auth, "replay_jobs")
    dlq_service.dlq_entry(request.auth, queue, entry_id)
    count = dlq_service.replay(request.auth, queue, ids=[entry_id], reset_attempts=options.reset_attempts,
                               run_at=options.run_at, source="api")
    return _missing_if_zero(count, queue, entry_id)


@router.post("/{queue}/dlq/{entry_id}/discard", response={200: BulkOut, **CHANGE}, summary="Discard one dead job",
             auth=needs("discard_jobs"))
def discard_one(request: HttpRequest, queue: QueueName, entry_id: EntryId):
    """404 when the entry is gone already. Needs discard_jobs."""
    require(request.auth, "discard_jobs")
    dlq_service.dlq_entry(request.auth, queue, entry_id)
    count = dlq_service.discard(request.auth, queue, ids=[entry_id], source="api")
    return _missing_if_zero(count, queue, entry_id)


def _missing_if_zero(count, queue: str, entry_id: str):
    if count == 0:
        raise NotFound(f"Dead-letter entry {entry_id} of queue {queue!r} was removed meanwhile, "
                       f"or cannot be replayed (its payload is unreadable)")
    return _bulk_response(count)
