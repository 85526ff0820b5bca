"""Which dead-letter entries a console view shows or acts on.

Mostly a pass-through to the service layer's DLQ filter. The one addition
is the error *group* (a fingerprint: error class plus normalised message),
which the engine groups by but cannot filter on. Entries of a group are found
by walking the filtered DLQ newest first, at most GROUP_SCAN_LIMIT entries
(the same bound ``groups`` uses), and a group is acted on by the ids found.
"""

from __future__ import annotations

from chasqui_core import services
from chasqui_core.engine.dlq import DLQFilter, Page

GROUP_SCAN_LIMIT = 100_000
SCAN_PAGE = 500


def page(actor, queue: str, f: DLQFilter, fingerprint: str, *, cursor: str | None, limit: int) -> Page:
    """A page of entries, newest first; ``next_cursor`` continues with older ones."""
    if not fingerprint:
        return services.dlq_page(actor, queue, filter=f, cursor=cursor, limit=limit, source="console")
    items = []
    scanned = 0
    while True:
        chunk = services.dlq_page(actor, queue, filter=f, cursor=cursor, limit=SCAN_PAGE, source="console")
        for dead in chunk.items:
            if dead.fingerprint != fingerprint:
                continue
            if len(items) == limit:  # one more match exists: the next page starts after the last shown
                return Page(items, items[-1].entry_id, scanned)
            items.append(dead)
        scanned += len(chunk.items)
        cursor = chunk.next_cursor
        if cursor is None or scanned >= GROUP_SCAN_LIMIT:
            return Page(items, cursor, scanned)


def group_ids(actor, queue: str, f: DLQFilter, fingerprint: str) -> list[str]:
    """Entry ids of one error group among the newest GROUP_SCAN_LIMIT entries matching ``f``."""
    ids: list[str] = []
    cursor = None
    scanned = 0
    while True:
        chunk = services.dlq_page(actor, queue, filter=f, cursor=cursor, limit=SCAN_PAGE, source="console")
        ids.extend(d.entry_id for d in chunk.items if d.fingerprint == fingerprint)
        scanned += len(chunk.items)
        cursor = chunk.next_cursor
        if cursor is None or scanned >= GROUP_SCAN_LIMIT:
            return ids


def count(actor, queue: str, f: DLQFilter, fingerprint: str) -> int:
    if fingerprint:
        return len(group_ids(actor, queue, f, fingerprint))
    return services.dlq_count(actor, queue, filter=f, source="console")
