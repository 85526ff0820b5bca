"""Workers, as their heartbeats describe them."""

from __future__ import annotations

from chasqui_core import access
from chasqui_core.engine import stats
from chasqui_core.services.common import InvalidInput, Source, redis_client, require, require_queue


def worker_list(
    actor, *, queue: str | None = None, stale_after_ms: int = stats.DEFAULT_STALE_AFTER_MS,
    source: Source = "api",
) -> list[stats.WorkerInfo]:
    """Workers known from their heartbeats; ``stale`` marks the ones that stopped beating."""
    require(actor, access.VIEW, source)
    if queue is not None:
        queue = require_queue(queue)
    if isinstance(stale_after_ms, bool) or not isinstance(stale_after_ms, int) or stale_after_ms < 1:
        raise InvalidInput(f"stale_after_ms must be a whole number of 1 or more, got {stale_after_ms!r}")
    return stats.workers(redis_client(), queue, stale_after_ms=stale_after_ms)
