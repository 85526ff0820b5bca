"""Masking for the Django side: the engine's ``redact`` with the project's extra keys.

``settings.CHASQUI["MASKED_KEYS"]`` adds key names to the engine's built-in
list (``chasqui_core.engine.jobs.redact.SECRET_KEYS``); it never removes one.
Reading the settings here makes sure the extra keys apply from the first
masked value a process shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.jobs import redact
from chasqui_core.engine.jobs.redact import MASK

__all__ = ["MASK", "mask", "mask_text", "masked_keys"]


def masked_keys() -> tuple[str, ...]:
    chasqui_settings()
    return redact.masked_keys()


def mask(value: Any, keys: Iterable[str] | None = None) -> Any:
    return redact.mask(value, masked_keys() if keys is None else keys)


def mask_text(text: str, keys: Iterable[str] | None = None) -> str:
    return redact.mask_text(text, masked_keys() if keys is None else keys)
