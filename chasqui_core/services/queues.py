"""Queues: live statistics and counter series, pausing or resuming a queue, and purging its waiting jobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chasqui_core import access
from chasqui_core.engine.ops import stats
from chasqui_core.engine.ops import metrics as metrics_mod
from chasqui_core.engine.ops import history
from chasqui_core.engine.ops import purge as purge_mod
from chasqui_core.engine.ops import totals as totals_mod
from chasqui_core.engine.ops import waiting
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.limits import BucketState, read_buckets
from chasqui_core.models import AuditEntry
from chasqui_core.services.audit import record
from chasqui_core.services.common import (
    Source,
    check_source,
    engine_errors,
    known_queues,
    page_limit,
    redis_client,
    require,
    require_queue,
)


def queue_overview(actor, *, source: Source = "api") -> list[stats.QueueStats]:
    """Live stats of every known queue, in one round trip."""
    require(actor, access.VIEW, source)
    return stats.all_queue_stats(redis_client(), known_queues())


def queue_detail(actor, queue: str, *, source: Source = "api") -> stats.QueueStats:
    require(actor, access.VIEW, source)
    return stats.queue_stats(redis_client(), require_queue(queue))


def queue_metrics(
    actor, queue: str, *, resolution: str = "second", window: int | None = None, source: Source = "api"
) -> metrics_mod.Series:
    """Counters per second (default: the last hour) or per minute (default: the last day)."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return metrics_mod.series(redis_client(), queue, resolution=resolution, window=window)


def queue_totals(actor, queue: str, *, source: Source = "api") -> totals_mod.QueueTotals:
    """A queue's all-time counters (fetched, completed, lost, recovered...) and its dead-lettered jobs per reason."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return totals_mod.read_totals(redis_client(), [queue])[queue]


def pause(actor, queue: str, *, source: Source) -> bool:
    """Stop workers reading the queue (nothing is lost); False when it was paused already."""
    return _switch(actor, queue, source, AuditEntry.Action.PAUSE, stats.pause)


def resume(actor, queue: str, *, source: Source) -> bool:
    """Let workers read the queue again; False when it was not paused."""
    return _switch(actor, queue, source, AuditEntry.Action.RESUME, stats.resume)


def _switch(actor, queue: str, source: str, action: str, flip: Callable[[Any, str], bool]) -> bool:
    check_source(source)
    require(actor, access.PAUSE, source)
    queue = require_queue(queue)
    changed = flip(redis_client(), queue)
    record(actor, action, source=source, queue=queue, count=1 if changed else 0, detail={"changed": changed})
    return changed


def stream_page(actor, queue: str, *, cursor: str | None = None, limit: int = 50, newest_first: bool = True,
                source: Source = "api") -> waiting.StreamPage:
    """The jobs in a queue's stream (waiting, or delivered and not settled), newest or oldest first."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    limit = page_limit(limit)
    with engine_errors:
        return waiting.page(redis_client(), queue, cursor=cursor or None, limit=limit, newest_first=newest_first)


@dataclass(frozen=True, slots=True)
class LimitState:
    """One rate or concurrency limit on a queue, summed over its buckets."""

    scope: str
    """The queue name or task path it is set on."""
    setting: str
    """What it allows, in words ("20 per 1 s, 2 at once per customer_id"); "" when this process's settings no
    longer name it (workers still hold its buckets)."""
    running: int
    waiting: int
    started: int
    buckets: list[BucketState]
    """The busiest buckets first (one per key value for a keyed limit)."""


def queue_limits(actor, queue: str, *, buckets: int = 20, source: Source = "api") -> list[LimitState]:
    """The limits on a queue's jobs with what each holds now: runs, starts within the rate's window and
    jobs waiting for room, per limit and for its busiest buckets. The queue's own limit (settings.CHASQUI
    ['LIMITS']) is always listed; a task's limit once its jobs have met it on this queue."""
    from chasqui_core.conf import chasqui_settings

    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    queues = set(known_queues())
    configured = {limit.scope: limit for limit in chasqui_settings().LIMITS
                  if limit.scope == queue or limit.scope not in queues}
    with engine_errors:
        states = read_buckets(redis_client(), QueueKeys.for_queue(queue),
                              {scope: limit.window_ms for scope, limit in configured.items() if limit.rate})
    by_scope: dict[str, list[BucketState]] = {}
    for state in states:
        by_scope.setdefault(state.scope, []).append(state)
    shown = [queue] if queue in configured else []
    shown += sorted(scope for scope in by_scope if scope != queue)  # a task's limit, where its jobs have run
    out = []
    for scope in shown:
        held = by_scope.get(scope, [])
        limit = configured.get(scope)
        out.append(LimitState(scope, limit.describe() if limit else "", sum(b.running for b in held),
                              sum(b.waiting for b in held), sum(b.started for b in held), held[:buckets]))
    return out
def waiting_count(actor, queue: str, *, source: Source = "api") -> int:
    """How many jobs a purge of the queue would delete now: its waiting jobs, not those handed to a worker."""
    return sum(waiting_by_band(actor, queue, source=source).values())


def waiting_by_band(actor, queue: str, *, source: Source = "api") -> dict[str, int]:
    """``waiting_count`` per priority band: "high", "default", "low" (a band the queue never had counts 0)."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    return purge_mod.waiting_by_band(redis_client(), QueueKeys.for_queue(queue))


def purge(actor, queue: str, *, source: Source) -> int:
    """Delete the queue's waiting jobs (not yet handed to a worker); returns how many. Needs discard_jobs.

    Jobs a worker holds (running, or fetched and about to run), the delayed
    set and the DLQ are left alone. Jobs added after the purge began are kept. Every priority band is emptied.
    The deleted jobs are counted as ``purged`` in the queue's counters.
    """
    check_source(source)
    require(actor, access.DISCARD, source)
    queue = require_queue(queue)
    client = redis_client()
    keys = QueueKeys.for_queue(queue)
    deleted = purge_mod.purge_waiting(client, keys, upto=purge_mod.newest_ids(client, keys))
    record(actor, AuditEntry.Action.PURGE, source=source, queue=queue, count=deleted, detail={"purged": deleted})
    return deleted


def queue_history(actor, queue: str, *, range: str = "1h", source: Source = "api") -> history.Window:
    """Failures over the last hour, day or week, and each task's runs, failures and run time since then."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return history.window(redis_client(), queue, range)


def all_history(actor, *, range: str = "1h", source: Source = "api") -> history.Window:
    """``queue_history`` for every known queue at once (the console's overview)."""
    require(actor, access.VIEW, source)
    client = redis_client()
    with engine_errors:
        names = known_queues()
        if not names:
            raise ValueError("no queue is known yet")
        return history.combined([history.window(client, name, range) for name in names])
