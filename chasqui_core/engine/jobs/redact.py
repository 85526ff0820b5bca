"""Hide secrets in job data and error texts.

Job arguments and error texts often carry credentials: a ``password`` kwarg,
a token quoted in an exception message, an ``Authorization`` header in a
traceback. Every API response and console page passes job data through
``mask``, and the DLQ's error fingerprints are computed from masked text, so
neither a screen, a URL nor a script's log shows them.

Masking is by key name (case-insensitive, substring match: ``db_password``
is a password), in structured data and in ``key=value``-like text, plus
bearer tokens and URL passwords wherever they appear. The keys are
``SECRET_KEYS`` and any a project adds with ``add_keys`` (the Django app adds
``settings.CHASQUI["MASKED_KEYS"]``). A harmless value masked by a loose match
costs a look at the raw job; a secret shown cannot be taken back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

MASK = "••••••"

SECRET_KEYS: tuple[str, ...] = (
    "password", "passwd", "pwd", "secret", "token", "api_key", "apikey", "private_key", "privatekey",
    "session", "sessionid", "session_id", "cookie", "authorization", "credential", "credentials",
)
"""Masked everywhere, whatever the settings say."""

_extra: tuple[str, ...] = ()


def add_keys(keys: Iterable[str]) -> None:
    """Mask these key names too, from now on, in this process (on top of SECRET_KEYS)."""
    global _extra
    _extra = tuple(sorted({k.lower() for k in keys if k} - set(SECRET_KEYS)))


def masked_keys() -> tuple[str, ...]:
    return SECRET_KEYS + _extra


def _key_is_secret(key: str, keys: tuple[str, ...]) -> bool:
    lowered = key.lower()
    return any(k in lowered for k in keys)


_VALUE = r"""(?:(?:bearer|basic|token|digest)\s+)?(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[^\s,;&'"<>(){}\[\]]+)"""


@lru_cache(maxsize=16)
def _patterns(keys: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    names = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True) if k)
    out = [
        # Authorization schemes anywhere: "Bearer abc.def", "Basic dXNlcjpw".
        re.compile(r"(?i)\b(bearer|basic|digest)(\s+)[A-Za-z0-9._~+/=\-]{6,}"),
        # Credentials in URLs: scheme://user:secret@host
        re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@]*:)([^\s@/]+)(@)"),
    ]
    if names:
        # key=value, key: value, "key": "value", 'key': 'value', key="value".
        out.append(re.compile(
            rf"""(?i)(["']?[\w.\-]*(?:{names})[\w.\-]*["']?)(\s*[:=]\s*)({_VALUE})"""
        ))
    return tuple(out)


def mask_text(text: str, keys: Iterable[str] | None = None) -> str:
    """``text`` with the values of secret-looking ``key=value`` pairs, bearer
    tokens and URL passwords replaced by MASK."""
    if not text:
        return text
    bearer, url, *rest = _patterns(_normalise(keys))
    text = bearer.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
    text = url.sub(lambda m: f"{m[1]}{MASK}{m[3]}", text)
    for pattern in rest:
        text = pattern.sub(_keep_quotes, text)
    return text


def _keep_quotes(m: re.Match[str]) -> str:
    value = m[3]
    if MASK in value:
        return m[0]
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{m[1]}{m[2]}{quote}{MASK}{quote}"


def _normalise(keys: Iterable[str] | None) -> tuple[str, ...]:
    if keys is None:
        keys = masked_keys()
    return tuple(sorted({k.lower() for k in keys if k}))


def mask(value: Any, keys: Iterable[str] | None = None) -> Any:
    """A copy of ``value`` with secrets hidden.

    Dict entries whose key names a secret get MASK in place of their value
    (whatever its type); every string, at any depth, has secrets in its text
    masked. Other values are returned as they are.
    """
    normalised = _normalise(keys)
    return _mask(value, normalised, 0)


_MAX_DEPTH = 64


def _mask(value: Any, keys: tuple[str, ...], depth: int) -> Any:
    if isinstance(value, str):
        return mask_text(value, keys)
    if depth > _MAX_DEPTH:
        return MASK  # nothing a person reads is nested this deep; do not recurse without end
    if isinstance(value, dict):
        return {
            k: (MASK if isinstance(k, str) and _key_is_secret(k, keys) and v not in (None, "")
                else _mask(v, keys, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_mask(v, keys, depth + 1) for v in value]
    return value
