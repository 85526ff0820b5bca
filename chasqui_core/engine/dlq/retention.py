"""How much of a DLQ is kept: at most N entries and/or entries younger than D days, the oldest trimmed first.

A DLQ left alone only grows. A queue's rule (``Retention``) is kept in Redis
beside its DLQ (``{chasqui:<q>}:dlq:retention``, written by ``publish``, which
``runworker`` calls with the project's settings), so every worker of the queue
and every console read the same one. The workers' operations part
(``operations.OperationsLoop``) trims each of its queues every
``TRIM_EVERY_S`` with ``dlq_trim.lua``: the oldest entries first, each taken
out of the DLQ's index in the same atomic call, at most ``TRIM_CHUNK`` per
call, and counted (``dlq_trimmed`` in the queue's counters and all-time
totals). Between two passes the DLQ may hold what died in those seconds above
its count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import Scripts

TRIM_EVERY_S = 5.0
"""How often a worker trims each of its queues' DLQs to their rule."""
TRIM_CHUNK = 1000
"""Entries removed per ``dlq_trim.lua`` call at most: a call holds the server a few milliseconds."""
WARN_AT = 0.9
"""The console warns once a DLQ holds this share of its most entries kept."""
DAY_MS = 86_400_000


def _check(value: Any, name: str, *, whole: bool) -> None:
    if value is None:
        return
    kind = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        what = "a whole number of entries" if whole else "a number of days"
        raise ValueError(f"{name} must be {what} above 0 (or None for no limit), got {value!r}")


@dataclass(frozen=True, slots=True)
class Retention:
    """One queue's rule; a field left None sets no limit of its kind."""

    max_entries: int | None = None
    """Keep at most this many dead jobs, the newest."""
    max_age_days: float | None = None
    """Keep dead jobs for this many days after they died."""

    def __post_init__(self) -> None:
        _check(self.max_entries, "max_entries", whole=True)
        _check(self.max_age_days, "max_age_days", whole=False)

    @property
    def keeps_all(self) -> bool:
        return self.max_entries is None and self.max_age_days is None

    @property
    def max_age_ms(self) -> int | None:
        return None if self.max_age_days is None else int(self.max_age_days * DAY_MS)

    def near_limit(self, length: int) -> bool:
        """Whether a DLQ of ``length`` entries is close enough to its count for the console to warn."""
        return self.max_entries is not None and length >= WARN_AT * self.max_entries

    def describe(self) -> str:
        parts = []
        if self.max_entries is not None:
            parts.append(f"at most {self.max_entries:,} entries")
        if self.max_age_days is not None:
            parts.append(f"entries for {self.max_age_days:g} day{'' if self.max_age_days == 1 else 's'}")
        return "keeps " + " and ".join(parts) + ", the oldest trimmed first" if parts else "keeps every entry"

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Retention:
        """A rule from ``{"max_entries": N, "max_age_days": D}``; errors name ``where`` (the setting)."""
        if not isinstance(d, dict):
            raise ValueError(
                f"{where} must be a dict such as {{'max_entries': 10000, 'max_age_days': 30}}, got {type(d).__name__}"
            )
        unknown = sorted(set(d) - {"max_entries", "max_age_days"})
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
                "'max_entries' and 'max_age_days'"
            )
        try:
            return cls(d.get("max_entries"), d.get("max_age_days"))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def rule_key(queue: str) -> str:
    return QueueKeys.for_queue(queue).dlq + ":retention"


def publish(client: Client, rules: dict[str, Retention]) -> None:
    """Write each queue's rule where its workers and consoles read it (a rule that keeps all deletes it)."""
    pipe = client.pipeline(transaction=False)
    for queue, rule in rules.items():
        key = rule_key(queue)
        pipe.delete(key)
        if not rule.keeps_all:
            pipe.hset(key, mapping={"max_entries": rule.max_entries or "", "max_age_days": rule.max_age_days or ""})
    pipe.execute()


def read(client: Client, queue: str) -> Retention:
    """The queue's rule as published (keeps all when none is)."""
    raw = client.hgetall(rule_key(queue))

    def field(name: bytes) -> str:
        value = raw.get(name, b"")
        return value.decode() if isinstance(value, bytes) else str(value)

    entries, days = field(b"max_entries"), field(b"max_age_days")
    return Retention(int(entries) if entries else None, float(days) if days else None)


def trim(client: Client, queue: str, rule: Retention, *, scripts: Scripts | None = None) -> int:
    """Remove what the rule does not keep, oldest first, a chunk per call; how many went."""
    if rule.keeps_all:
        return 0
    keys = QueueKeys.for_queue(queue)
    scripts = scripts or Scripts(client)
    args = [
        "" if rule.max_entries is None else rule.max_entries,
        "" if rule.max_age_ms is None else rule.max_age_ms,
        TRIM_CHUNK,
        keys.metrics,
    ]
    removed = 0
    while True:
        n = int(scripts.dlq_trim(keys=[keys.dlq], args=args))
        removed += n
        if n < TRIM_CHUNK:
            return removed


def trimmed(client: Client, queue: str) -> int:
    """Entries trimmed from the queue's DLQ since it began (its all-time ``dlq_trimmed`` counter)."""
    return int(client.hget(QueueKeys.for_queue(queue).totals, "dlq_trimmed") or 0)
