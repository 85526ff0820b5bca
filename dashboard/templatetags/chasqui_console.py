"""Formatting for console pages: counts, rates, ages, times, and masked job data.

Every filter returns plain text, which the template then escapes; none of
them marks anything safe, so job data stays escaped whatever it contains.
"""

from __future__ import annotations

import json
from datetime import datetime, UTC
from typing import Any

from django import template
from django.conf import settings
from django.shortcuts import resolve_url

from chasqui_core.masking import mask, mask_text

from ..fragments import fmt_rate

register = template.Library()


@register.simple_tag
def login_url() -> str:
    """The project's login page (``settings.LOGIN_URL``, a path or a URL name), where a lapsed session goes."""
    return resolve_url(settings.LOGIN_URL)


@register.filter
def count(value: Any) -> str:
    """1234567 -> "1,234,567"."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "—"


@register.filter
def rate(value: Any) -> str:
    try:
        return fmt_rate(float(value))
    except (TypeError, ValueError):
        return "—"


@register.filter
def duration_ms(value: Any) -> str:
    """A span of milliseconds in the largest units that matter: "850 ms", "4.2 s", "3 m 12 s", "2 h 5 m"."""
    try:
        ms = int(value)
    except (TypeError, ValueError):
        return "—"
    if ms < 0:
        return "—"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} m"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@register.filter
def age(value: Any) -> str:
    """Like duration_ms, but "—" for zero (nothing overdue)."""
    try:
        return duration_ms(value) if int(value) > 0 else "—"
    except (TypeError, ValueError):
        return "—"


def _dt(ms: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


@register.filter
def kib(value: Any) -> str:
    """A size in KiB for people: "812 KiB", "143 MiB", "1.2 GiB"; "—" when unknown (0)."""
    try:
        size = int(value)
    except (TypeError, ValueError):
        return "—"
    if size <= 0:
        return "—"
    if size < 1024:
        return f"{size} KiB"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} MiB"
    return f"{size / 1024 / 1024:.1f} GiB"


@register.filter
def ms_time(value: Any) -> str:
    """Epoch ms -> "2025-11-21 06:12:03" (UTC)."""
    dt = _dt(value)
    return dt.strftime("%Y-%m-%d %H:%M:%S") if dt else "—"


@register.filter
def ms_iso(value: Any) -> str:
    dt = _dt(value)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z") if dt else ""


@register.filter
def ago(value: Any, now_ms: Any) -> str:
    """How long before ``now_ms`` the time ``value`` was: "12 s ago", or "in 3 m 05 s" when ahead."""
    try:
        delta = int(now_ms) - int(value)
    except (TypeError, ValueError):
        return "—"
    if delta < 0:
        return f"in {duration_ms(-delta)}"
    if delta < 1000:
        return "just now"
    return f"{duration_ms(delta)} ago"


@register.filter
def masked(value: Any) -> Any:
    """Secrets hidden (see chasqui_core.masking): key=value pairs, bearer tokens, URL passwords."""
    if isinstance(value, str):
        return mask_text(value)
    return mask(value)


@register.filter
def pretty(value: Any) -> str:
    """Job arguments as indented JSON, secrets masked."""
    try:
        return json.dumps(mask(value), indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return repr(mask(value))


@register.filter
def percent(part: Any, whole: Any) -> int:
    try:
        part, whole = int(part), int(whole)
    except (TypeError, ValueError):
        return 0
    return min(100, round(part * 100 / whole)) if whole > 0 else 0


@register.filter
def short_id(value: Any) -> str:
    text = str(value or "")
    return text if len(text) <= 14 else f"{text[:6]}…{text[-6:]}"


@register.simple_tag(takes_context=True)
def has_perm(context, codename: str) -> bool:
    user = context.get("user")
    return bool(user is not None and user.has_perm(f"chasqui_core.{codename}"))


@register.filter
def rate_of(live: Any, counter: str) -> str:
    """A QueueLive's live rate of one counter, formatted: ``{{ q|rate_of:"retried" }}``."""
    return fmt_rate(live.rate(counter))


@register.filter
def rate_of_raw(live: Any, counter: str) -> float:
    return live.rate(counter)


@register.filter
def total_of(live: Any, counter: str) -> int:
    """A QueueLive's count of one counter over the live window (5 minutes)."""
    return live.total(counter)


@register.filter
def words(value: Any) -> str:
    """``retries_exhausted`` -> ``retries exhausted``."""
    return str(value or "").replace("_", " ")
