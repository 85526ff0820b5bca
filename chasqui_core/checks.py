"""Django system checks of Chasqui's settings that are warnings, not errors (those stop the start in conf.py).

Registered by the app (apps.py), so ``manage.py check``, ``runserver`` and
``runworker`` report them.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import CheckMessage, Warning
from django.core.exceptions import ImproperlyConfigured

from chasqui_core.conf import chasqui_settings

MIN_KEY_BYTES = 32
"""Shorter signing keys may be guessed offline from any signed job read out of Redis."""


def signing_keys(app_configs=None, **kwargs) -> list[CheckMessage]:
    """Warn when a production site runs unsigned jobs, or signs them with a key short enough to guess."""
    try:
        keys = chasqui_settings().SIGNING_KEYS
    except ImproperlyConfigured:
        return []  # reported as an error by the task backend's own check (chasqui.E001)
    out: list[CheckMessage] = []
    if not keys and not settings.DEBUG:
        out.append(Warning(
            "settings.CHASQUI['SIGNING_KEYS'] is not set: workers run any job written to Redis, so anyone who "
            "can write to Redis can run the project's tasks with arguments of their choosing.",
            hint="Set CHASQUI['SIGNING_KEYS'] = [<a random key, e.g. secrets.token_urlsafe(32)>] on producers and "
                 "workers alike; see docs/security.md.",
            id="chasqui.security.W001"))
    for i, key in enumerate(keys):
        if len(key) < MIN_KEY_BYTES:
            out.append(Warning(
                f"settings.CHASQUI['SIGNING_KEYS'][{i}] is {len(key)} bytes long: anyone who can read a signed "
                "job from Redis can try to guess a short key offline.",
                hint=f"Use {MIN_KEY_BYTES} random bytes or more, e.g. secrets.token_urlsafe(32).",
                id="chasqui.security.W002"))
    return out
