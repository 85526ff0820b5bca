"""The terminal side of ``manage.py chasqui``: times read and written as people type them, tables, a progress
bar, and Ctrl-C taken between two chunks of a long replay or discard, so what is done stays done.

Kept apart from the command, which only maps subcommands to the services.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, UTC
from typing import Any

from django.core.management.base import CommandError

_AGO = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(value: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 date/time (no zone means UTC) or a span ago: "90s", "30m", "1h", "2d", "1w"."""
    m = _AGO.match(value)
    if m:
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[m[2].lower()]: int(m[1])})
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise CommandError(
            f"{value!r} is not a time: use ISO 8601 (2026-01-31T12:00:00Z) or a span ago such as 30m, 1h, 2d"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(ms: int) -> str:
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def shorten(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


class ProgressBar:
    """A one-line bar redrawn in place on a terminal; a line every few seconds elsewhere (logs, CI)."""

    WIDTH = 30

    def __init__(self, out, label: str, *, tty: bool | None = None, every: float = 2.0) -> None:
        self.out = out
        self.label = label
        self.tty = out.isatty() if tty is None else tty
        self.every = every
        self._last: float | None = None
        self.done = 0
        self.total = 0

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if self.tty:
            share = done / total if total else 1.0
            filled = int(self.WIDTH * share)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.out.write(f"\r{self.label} [{bar}] {done:,}/{total:,} {share:4.0%}")
            self.out.flush()
        elif self._last is None or now - self._last >= self.every or done == total:
            self._last = now
            self.out.write(f"{self.label}: {done:,}/{total:,}\n")

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


class Interrupt:
    """Ctrl-C asks the running sweep to stop after its current chunk, instead of killing it mid-call."""

    def __init__(self, out) -> None:
        self.out = out
        self.requested = False
        self._previous = None

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second Ctrl-C: the operator really wants out
            raise KeyboardInterrupt
        self.requested = True
        self.out.write("\nStopping after the current chunk (Ctrl-C again to abort at once)...\n")

    def __call__(self) -> bool:
        return self.requested

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
