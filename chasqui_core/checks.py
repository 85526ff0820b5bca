"""Django system checks of Chasqui's settings and installation.

Every mistake in the settings Chasqui reads is reported here (or by the
task backend's own check, chasqui.E001, for ``settings.CHASQUI``) in words
naming the setting, rather than as a start-up traceback: a Redis URL that
cannot name a server (E003), a ``runworker`` command shadowed by another
app's (E004), a wrong type in a setting outside ``CHASQUI`` (E005), and the
security warnings.

Registered by the app (apps.py), so ``manage.py check``, ``runserver`` and
``runworker`` report them.
"""

from __future__ import annotations

from django.conf import settings
from django.apps import apps
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.core.management import get_commands

from chasqui_core.conf import chasqui_settings, key_failure_policy

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


def redis_url(app_configs=None, **kwargs) -> list[CheckMessage]:
    """An error for a Redis URL no client can use (empty, scheme, port, database), naming its setting."""
    try:
        problem = chasqui_settings().redis_url_problem
    except ImproperlyConfigured:
        return []  # reported by chasqui.E001
    return [] if problem is None else [Error(problem, id="chasqui.E003")]


def _number(name: str, default: float, *, whole: bool) -> CheckMessage | None:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or value <= 0:
        kind = "a whole number of 1 or more" if whole else "a number above 0"
        return Error(f"settings.{name} must be {kind}, got {value!r}.", id="chasqui.E005")
    return None


def other_settings(app_configs=None, **kwargs) -> list[CheckMessage]:
    """Errors for the settings Chasqui reads outside ``CHASQUI`` whose type is wrong, naming each.

    Without this, ``API_KEY_FAILURE_LIMIT = "twenty"`` passed ``check`` and
    surfaced as a TypeError quoted to an API client at the second wrong key.
    """
    out: list[CheckMessage] = []
    try:
        key_failure_policy()
    except ImproperlyConfigured as exc:
        out.append(Error(str(exc), id="chasqui.E005"))
    sampler = _number("CHASQUI_SAMPLER_INTERVAL", 1.0, whole=False)
    if sampler is not None:
        out.append(sampler)
    login_url = getattr(settings, "LOGIN_URL", None)
    if not isinstance(login_url, str) or not login_url.strip():
        out.append(Error(f"settings.LOGIN_URL must be a path or a URL name (the console sends visitors who are "
                         f"not logged in there), got {login_url!r}.", id="chasqui.E005"))
    return out


def runworker_command(app_configs=None, **kwargs) -> list[CheckMessage]:
    """An error when another app's ``runworker`` (Channels') would run instead of Chasqui's.

    Django takes a command from the first installed app that has one, and
    Channels ships a ``runworker`` of its own: with ``channels`` listed above
    ``chasqui_core``, ``manage.py runworker emails`` would silently start a
    Channels worker, which fails later on with a Redis timeout. This check
    runs before any command, Channels' ``runworker`` included, so the mistake
    stops it with the fix instead.
    """
    owner = get_commands().get("runworker")
    ours = apps.get_containing_app_config(__name__)
    if ours is None or owner is None or owner == ours.name:
        return []
    return [Error(
        f"'manage.py runworker' would run the command of the {owner!r} app, not Chasqui's worker: Django takes a "
        f"command from the first app in INSTALLED_APPS that has it, and {owner!r} is listed above {ours.name!r}.",
        hint=f"Move {ours.name!r} above {owner!r} in INSTALLED_APPS.",
        id="chasqui.E004")]
