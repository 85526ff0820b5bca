"""The filter language of the DLQ: which dead jobs to show or act on.

The console's form, the API's query parameters, the CLI's options and a
stored background operation all describe a filter the same way, as a
``DLQFilter`` or its ``to_dict()``. Matching has two steps: ``precheck``
decides from an entry's plain fields when it can, so a scan decodes the
envelope only of entries those fields cannot settle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chasqui_core.engine.dlq.entries import REASONS, DeadJob, field_text
from chasqui_core.engine.dlq.fingerprint import fingerprint, fingerprint_id

_FILTER_FIELDS = ("task", "reason", "error_class", "error_text", "fingerprint", "since_ms", "until_ms")
_FINGERPRINT_ID = re.compile(r"[0-9a-f]{16}")


def _fingerprint_matches(wanted: str, actual: str) -> bool:
    """``wanted`` is a fingerprint id (as groups give it) or, for scripts written earlier, its text."""
    if _FINGERPRINT_ID.fullmatch(wanted):
        return fingerprint_id(actual) == wanted
    return actual == wanted


def _group_matches(wanted: str, stored_id: str, error_class: str, error: str) -> bool:
    """Whether an entry is in the group ``wanted``: by the fingerprint id written with it when it has one."""
    if stored_id and _FINGERPRINT_ID.fullmatch(wanted):
        return stored_id == wanted
    return _fingerprint_matches(wanted, fingerprint(error_class, error))


def _class_matches(wanted: str, actual: str) -> bool:
    return actual == wanted or actual.rpartition(".")[2] == wanted


@dataclass(frozen=True, slots=True)
class DLQFilter:
    """Which dead jobs to show or act on; unset fields match everything.

    Empty or blank strings count as unset, so a filter built straight from a
    form or a query string means what the operator typed.
    """

    task: str | None = None
    """Exact task name."""
    reason: str | None = None
    """One of REASONS."""
    error_class: str | None = None
    """Exact class name, or its last dotted part ("ValueError" matches "builtins.ValueError")."""
    error_text: str | None = None
    """Case-insensitive text found in the last error message or any message of the history."""
    fingerprint: str | None = None
    """One group of the "group by error" view: its id (``ErrorGroup.id``), or the fingerprint's exact text."""
    since_ms: int | None = None
    """Died at or after this time (epoch ms)."""
    until_ms: int | None = None
    """Died before this time (epoch ms)."""

    def __post_init__(self) -> None:
        for name in ("task", "reason", "error_class", "error_text", "fingerprint"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise TypeError(f"DLQ filter {name} must be text, got {type(value).__name__}")
            if not value.strip():
                object.__setattr__(self, name, None)
            elif name not in ("error_text", "fingerprint"):
                object.__setattr__(self, name, value.strip())
        if self.reason is not None and self.reason not in REASONS:
            raise ValueError(f"Unknown dead-letter reason {self.reason!r}: use one of {', '.join(REASONS)}")
        for name in ("since_ms", "until_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"DLQ filter {name} must be a time in epoch milliseconds (0 or more), got {value!r}")
        if self.since_ms is not None and self.until_ms is not None and self.since_ms > self.until_ms:
            raise ValueError(
                f"The time range is empty: since_ms ({self.since_ms}) is after until_ms ({self.until_ms})"
            )

    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in _FILTER_FIELDS)

    def time_only(self) -> bool:
        """True when only the time range is set: the readers then answer with an id range alone."""
        return (self.task is None and self.reason is None and self.error_class is None and self.error_text is None
                and self.fingerprint is None)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FILTER_FIELDS if getattr(self, name) is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DLQFilter:
        """Build a filter from ``to_dict`` output or query parameters (times may be digit strings)."""
        if not isinstance(d, Mapping):
            raise TypeError(f"A DLQ filter must be built from a mapping, got {type(d).__name__}")
        unknown = [key for key in d if key not in _FILTER_FIELDS]
        if unknown:
            raise ValueError(
                f"Unknown DLQ filter field(s) {', '.join(map(repr, unknown))}; "
                f"known fields are {', '.join(_FILTER_FIELDS)}"
            )
        values = dict(d)
        for name in ("since_ms", "until_ms"):
            value = values.get(name)
            if isinstance(value, str):
                text = value.strip()
                if not text:
                    values[name] = None
                elif text.isdigit():
                    values[name] = int(text)
                else:
                    raise ValueError(f"DLQ filter {name} must be a time in epoch milliseconds, got {value!r}")
        return cls(**values)

    def matches(self, job: DeadJob) -> bool:
        if self.since_ms is not None and job.dead_at_ms < self.since_ms:
            return False
        if self.until_ms is not None and job.dead_at_ms >= self.until_ms:
            return False
        if self.reason is not None and job.reason != self.reason:
            return False
        if self.task is not None and job.task != self.task:
            return False
        if self.error_class is not None and not _class_matches(self.error_class, job.error_class):
            return False
        if self.fingerprint is not None and not _group_matches(self.fingerprint, job.stored_fingerprint_id,
                                                               job.error_class, job.error):
            return False
        if self.error_text is not None:
            needle = self.error_text.casefold()
            if needle not in job.error.casefold() and not any(
                needle in str(record.get("message", "")).casefold()
                for record in job.errors if isinstance(record, dict)
            ):
                return False
        return True

    def precheck(self, dead_at_ms: int, fields: dict[bytes, bytes]) -> bool | None:
        """Match on the entry's plain fields: True or False when they decide, None when the envelope must.

        Most filters are decided here, which spares decoding the payload of
        every entry a scan passes over.
        """
        if self.since_ms is not None and dead_at_ms < self.since_ms:
            return False
        if self.until_ms is not None and dead_at_ms >= self.until_ms:
            return False
        if self.reason is not None and field_text(fields, b"reason") != self.reason:
            return False
        if self.error_class is not None and not _class_matches(self.error_class, field_text(fields, b"error_class")):
            return False
        if self.fingerprint is not None and not _group_matches(
                self.fingerprint, field_text(fields, b"fp"), field_text(fields, b"error_class"),
                field_text(fields, b"error")):
            return False
        undecided = False
        if self.task is not None:
            task = field_text(fields, b"task")
            if task and task != self.task:
                return False
            undecided = not task  # written without a task name: it is in the envelope
        if self.error_text is not None and self.error_text.casefold() not in field_text(fields, b"error").casefold():
            undecided = True  # may be in the history
        return None if undecided else True
