"""Hide secrets in what operators are shown.

Job arguments and error texts often carry credentials: a ``password`` kwarg,
a token quoted in an exception message, an ``Authorization`` header in a
traceback. Every API response and console page passes through ``mask`` so an
operator's screen (or a script's log) never shows them. Masking is by key
name (``settings.CHASQUI["MASKED_KEYS"]``, case-insensitive, substring match),
both in structured data and in ``key=value``-like text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

MASK = "••••••"


def masked_keys() -> tuple[str, ...]:
    from chasqui_core.conf import chasqui_settings

    return chasqui_settings().MASKED_KEYS


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
