"""The audit log: every change is written here by the area that made it, and read back by operators.

``record`` lives with the reader rather than in ``common`` so that one module
owns the AuditEntry rows and what goes into them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any

from chasqui_core import access
from chasqui_core.models import AuditEntry
from chasqui_core.services.common import SOURCES, InvalidInput, Source, check_source, page_limit, require


def actor_label(actor) -> str:
    if actor is None:
        return "cli"
    name = actor.get_username() if hasattr(actor, "get_username") else str(actor)
    key = getattr(actor, "chasqui_api_key", None)
    return f"{name} (API key {key})" if key else name


def record(
    actor,
    action: str,
    *,
    source: str,
    queue: str = "",
    target_ids: Iterable[Any] = (),
    filter: Mapping[str, Any] | None = None,
    count: int = 0,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Write one audit entry. ``actor`` may carry ``chasqui_api_key`` (the key's prefix) when it came by key."""
    check_source(source)
    ids = [str(i) for i in list(target_ids)[:AuditEntry.MAX_TARGET_IDS]]
    extra = dict(detail or {})
    key = getattr(actor, "chasqui_api_key", None)
    if key:
        extra["key_prefix"] = key
    return AuditEntry.objects.create(
        actor=actor if actor is not None and getattr(actor, "pk", None) else None,
        actor_repr=actor_label(actor)[:200],
        action=action,
        queue=queue,
        source=source,
        target_ids=ids,
        filter=dict(filter or {}),
        count=count,
        detail=extra,
    )


@dataclass(frozen=True, slots=True)
class AuditPage:
    items: list[AuditEntry]
    next_cursor: str | None


def audit_log(
    actor,
    *,
    action: str | None = None,
    queue: str | None = None,
    actor_name: str | None = None,
    source_filter: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
    source: Source = "api",
) -> AuditPage:
    """Audit entries newest first, filtered; ``next_cursor`` continues with older ones."""
    require(actor, access.VIEW, source)
    limit = page_limit(limit)
    qs = AuditEntry.objects.order_by("-id")
    if action:
        if action not in AuditEntry.Action.values:
            raise InvalidInput(f"Unknown action {action!r}: use one of {', '.join(AuditEntry.Action.values)}")
        qs = qs.filter(action=action)
    if source_filter:
        if source_filter not in SOURCES:
            raise InvalidInput(f"Unknown source {source_filter!r}: use one of {', '.join(SOURCES)}")
        qs = qs.filter(source=source_filter)
    if queue:
        qs = qs.filter(queue=_clean_text(queue, "queue"))
    if actor_name:
        qs = qs.filter(actor_repr__startswith=_clean_text(actor_name, "actor"))
    if since is not None:
        qs = qs.filter(at__gte=_aware(since))
    if until is not None:
        qs = qs.filter(at__lt=_aware(until))
    if cursor:
        if not cursor.isdigit() or len(cursor) > 18:
            raise InvalidInput(f"cursor {cursor!r} is not one returned by a previous page; start without a cursor")
        qs = qs.filter(id__lt=int(cursor))
    rows = list(qs.select_related("actor")[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(rows, str(rows[-1].id) if more and rows else None)


def _clean_text(value: str, name: str) -> str:
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters")
    return value


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
