"""The dead-letter queue: browse, group and count dead jobs; replay or discard them.

Replays and discards by filter that match more than ``background_threshold()``
entries, whose count is only an estimate (free text over more entries than a
bounded read covers), or that are paced with a ``rate``, are handed to
``background``: the queue's workers sweep them, outside the web process. What
runs inline reads only its matching entries (through the DLQ's index) or a
range of at most the estimate's bounded read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chasqui_core import access
from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.dlq.browse import ErrorGroup, Grouping, Page
from chasqui_core.engine.dlq.entries import DeadJob
from chasqui_core.engine.dlq.estimate import Estimate, estimate_matching
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.index import IndexState
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.dlq.retention import Retention
from chasqui_core.engine.dlq.search import SearchPage, TextSearch
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.masking import masked_keys
from chasqui_core.services.background import launch as launch_in_background
from chasqui_core.services.audit import record
from chasqui_core.services.common import (
    InvalidInput,
    Source,
    check_source,
    engine_errors,
    epoch_ms,
    page_limit,
    redis_client,
    require,
    require_queue,
)

Progress = Callable[[int, int], None]
ShouldStop = Callable[[], bool]


def background_threshold() -> int:
    """Filtered replays/discards matching more entries than this run in the background."""
    return chasqui_settings().BACKGROUND_THRESHOLD


def build_filter(
    *,
    task: str | None = None,
    reason: str | None = None,
    error_class: str | None = None,
    error_text: str | None = None,
    fingerprint: str | None = None,
    since: datetime | int | None = None,
    until: datetime | int | None = None,
) -> DLQFilter:
    """A DLQFilter from what a person typed; times are datetimes (naive = UTC) or epoch ms.

    ``fingerprint`` is one error group exactly as ``dlq_groups`` (or an entry's
    ``fingerprint``) gives it: acting on a group is an ordinary filtered operation.
    """
    since_ms, until_ms = epoch_ms(since, "since"), epoch_ms(until, "until")
    with engine_errors:
        return DLQFilter(task=task, reason=reason, error_class=error_class, error_text=error_text,
                         fingerprint=fingerprint, since_ms=since_ms, until_ms=until_ms)


def coerce_filter(value: DLQFilter | Mapping[str, Any] | None) -> DLQFilter:
    """A DLQFilter from a filter, its ``to_dict()`` form (``fingerprint`` included), or None (everything)."""
    if value is None:
        return DLQFilter()
    if isinstance(value, DLQFilter):
        return value
    with engine_errors:
        return DLQFilter.from_dict(value)


def _dead_letters(queue: str) -> DeadLetters:
    return DeadLetters(redis_client(), queue)


@dataclass(frozen=True, slots=True)
class RetentionState:
    """A DLQ's retention rule with what it means now, for the console and the API."""

    rule: Retention
    length: int
    trimmed: int
    """Entries the rule has trimmed since the DLQ began (the all-time ``dlq_trimmed`` counter)."""

    @property
    def near_limit(self) -> bool:
        return self.rule.near_limit(self.length)


def dlq_retention(actor, queue: str, *, source: Source = "api") -> RetentionState:
    """The queue's DLQ retention rule (settings: DLQ_MAX_ENTRIES, DLQ_MAX_AGE_DAYS, DLQ_RETENTION), its length
    and how many entries the rule trimmed."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    keys = QueueKeys.for_queue(queue)
    with engine_errors:
        pipe = redis_client().pipeline(transaction=False)
        pipe.xlen(keys.dlq)
        pipe.hget(keys.totals, "dlq_trimmed")
        length, trimmed = pipe.execute()
    return RetentionState(chasqui_settings().dlq_retention(queue), int(length), int(trimmed or 0))


def dlq_page(
    actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None, cursor: str | None = None,
    limit: int = 50, source: Source = "api",
) -> Page:
    """Dead jobs newest first; pass ``next_cursor`` back for the next (older) page."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    limit = page_limit(limit)
    f = coerce_filter(filter)
    with engine_errors:
        return _dead_letters(queue).page(cursor=cursor or None, limit=limit, filter=f)


def dlq_entry(actor, queue: str, entry_id: str, *, source: Source = "api") -> DeadJob:
    """One dead job with its whole error history."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return _dead_letters(queue).get(entry_id)


def dlq_groups(
    actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None, source: Source = "api"
) -> list[ErrorGroup]:
    """Dead jobs grouped by error fingerprint (class + normalised message), biggest group first."""
    return dlq_grouping(actor, queue, filter=filter, source=source).groups


def dlq_grouping(
    actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None, source: Source = "api"
) -> Grouping:
    """The grouped view: the biggest groups, and whether they cover every matching entry (from the DLQ's
    index) or the newest ones a scan reached; see ``DLQReader.grouping``."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    f = coerce_filter(filter)
    with engine_errors:
        return _dead_letters(queue).grouping(f)


def rebuild_index(actor, queue: str, *, source: Source = "cli",
                  progress: Callable[[int, int], None] | None = None) -> IndexState:
    """Rebuild the DLQ's index until it is ready (``manage.py chasqui reindex``); reads do this a moment at a
    time by themselves, this does it at once."""
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    with engine_errors:
        return _dead_letters(queue).index.rebuild(progress)


def dlq_count(actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None,
              source: Source = "api") -> int:
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    f = coerce_filter(filter)
    with engine_errors:
        return _dead_letters(queue).count_matching(f)


def dlq_estimate(actor, queue: str, *, filter: DLQFilter | Mapping[str, Any] | None = None,
                 source: Source = "api") -> Estimate:
    """How many entries match, at once: exact when a bounded read can tell, else "about" (``exact`` False).

    What a confirmation shows before a bulk action, which must not wait on a scan of the whole DLQ.
    """
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    f = coerce_filter(filter)
    with engine_errors:
        return estimate_matching(_dead_letters(queue), f)



def dlq_search(actor, queue: str, text: str, *, cursor: str | None = None, limit: int = 50,
               time_limit: float = 0.5, source: Source = "api") -> SearchPage:
    """Dead jobs whose id, task, error or arguments hold ``text`` (case-insensitive), newest first.

    One call reads the DLQ for at most ``time_limit`` seconds; pass ``next_cursor`` back to go on (None: the
    whole DLQ was read). Secrets are masked before matching, so a masked value is never found.
    """
    require(actor, access.VIEW, source)
    queue = require_queue(queue)
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("Type some text to search the dead letters for")
    limit = page_limit(limit)
    with engine_errors:
        return TextSearch(redis_client(), queue, masked_keys=masked_keys()).search(
            text, cursor=cursor or None, limit=limit, time_limit=time_limit)


# --- replay and discard -------------------------------------------------------------------------


def replay(
    actor,
    queue: str,
    *,
    ids: Iterable[str] | None = None,
    filter: DLQFilter | Mapping[str, Any] | None = None,
    reset_attempts: bool = True,
    run_at: datetime | int | None = None,
    rate: int | None = None,
    source: Source,
    background: bool | None = None,
    progress: Progress | None = None,
    should_stop: ShouldStop | None = None,
) -> int | Operation:
    """Send dead jobs back to work, by entry ids or by filter (exactly one of them).

    ``reset_attempts`` gives each job its whole retry budget again; False
    grants exactly one more run. ``run_at`` schedules them instead of running
    them now. ``rate`` (jobs per second, by filter only) paces the replay so
    it does not flood the workers; a paced replay always runs in the
    background. Returns how many entries were replayed, or, for a filter that
    matches more than ``background_threshold()`` entries (or whose count is
    an estimate), the started background Operation (``background=True``/``False`` forces either way).
    ``progress(done, total)`` and ``should_stop()`` apply when run inline;
    stopping leaves every entry either replayed or untouched.
    """
    check_source(source)
    require(actor, access.REPLAY, source)
    if not isinstance(reset_attempts, bool):
        raise InvalidInput("reset_attempts must be true or false")
    options: dict[str, Any] = {"reset_attempts": reset_attempts, "run_at_ms": epoch_ms(run_at, "run_at")}
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
            raise InvalidInput(f"rate must be a whole number of jobs per second, 1 or more (got {rate!r})")
        if ids is not None:
            raise InvalidInput("A rate applies to replays by filter; a list of ids is replayed at once")
        if background is False:
            raise InvalidInput("A paced replay (with a rate) runs in the background")
        options["rate"] = rate
        background = True
    return _bulk(actor, Operation.Kind.REPLAY, queue, ids, filter, options, source, background, progress,
                 should_stop)


def discard(
    actor,
    queue: str,
    *,
    ids: Iterable[str] | None = None,
    filter: DLQFilter | Mapping[str, Any] | None = None,
    source: Source,
    background: bool | None = None,
    progress: Progress | None = None,
    should_stop: ShouldStop | None = None,
) -> int | Operation:
    """Delete dead jobs for good, by entry ids or by filter; see ``replay`` for the rest."""
    check_source(source)
    require(actor, access.DISCARD, source)
    return _bulk(actor, Operation.Kind.DISCARD, queue, ids, filter, {}, source, background, progress, should_stop)


def _bulk(actor, kind: str, queue: str, ids, filter, options: dict, source: str, in_background: bool | None,
          progress: Progress | None, should_stop: ShouldStop | None) -> int | Operation:
    queue = require_queue(queue)
    if (ids is None) == (filter is None):
        raise InvalidInput("Give either a list of entry ids or a filter (an empty filter matches every entry)")
    dl = _dead_letters(queue)
    action = AuditEntry.Action.REPLAY if kind == Operation.Kind.REPLAY else AuditEntry.Action.DISCARD
    if ids is not None:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise InvalidInput("ids must be a list of dead-letter entry ids")
        ids = list(ids)
        if not ids:
            raise InvalidInput("ids is empty: give at least one dead-letter entry id")
        with engine_errors:
            if kind == Operation.Kind.REPLAY:
                count = dl.replay(ids, reset_attempts=options["reset_attempts"], run_at_ms=options["run_at_ms"])
            else:
                count = dl.discard(ids)
        record(actor, action, source=source, queue=queue, target_ids=ids, count=count,
               detail={**options, "requested": len(ids)})
        return count

    f = coerce_filter(filter)
    if in_background is not False:
        with engine_errors:
            matching = estimate_matching(dl, f)
        if in_background is None:
            # an estimate ("about") means the matches are only known by reading more of the DLQ than a request
            # may (free text over a big DLQ): a worker sweeps it, however few it says
            in_background = matching.count > background_threshold() or not matching.exact
        if in_background:
            return launch_in_background(actor, kind, queue, f, options, source, total=matching.count,
                                        total_exact=matching.exact)

    tracker = _Tracker(progress, should_stop)
    with engine_errors:
        if kind == Operation.Kind.REPLAY:
            count = dl.replay_matching(f, reset_attempts=options["reset_attempts"], run_at_ms=options["run_at_ms"],
                                       progress=tracker.progress, should_stop=tracker.should_stop)
        else:
            count = dl.discard_matching(f, progress=tracker.progress, should_stop=tracker.should_stop)
    detail = {**options, "done": tracker.done, "total": tracker.total}
    if tracker.stopped:
        detail["interrupted"] = True
    record(actor, action, source=source, queue=queue, filter=f.to_dict(), count=count, detail=detail)
    return count


class _Tracker:
    """Remembers the last progress figures and whether a stop was asked, for the audit entry."""

    def __init__(self, progress: Progress | None, should_stop: ShouldStop | None) -> None:
        self._progress = progress
        self._should_stop = should_stop
        self.done = 0
        self.total = 0
        self.stopped = False

    def progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self._progress is not None:
            self._progress(done, total)

    def should_stop(self) -> bool:
        if self._should_stop is not None and self._should_stop():
            self.stopped = True
        return self.stopped
