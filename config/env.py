"""Small, strict helpers for reading settings from environment variables.

Settings come from the environment so that the same code runs on a laptop, in
CI and in production. A typo such as ``DEBUG=ture`` must not silently fall back
to a default, so unknown values raise ``ImproperlyConfigured`` naming the
variable and the accepted spellings.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from django.core.exceptions import ImproperlyConfigured

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
FALSE_VALUES = frozenset({"0", "false", "no", "off"})


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def env_str(name: str, default: str = "", *, environ: Mapping[str, str] | None = None) -> str:
    """The variable's value with surrounding blanks removed, or ``default``."""
    value = _environ(environ).get(name)
    return default if value is None else value.strip()


def parse_bool(name: str, value: str) -> bool:
    """Parse one boolean spelling; ``name`` is only used in the error message."""
    normalized = value.strip().lower()
    if normalized in TRUE_VALUES:
        return True
    if normalized in FALSE_VALUES:
        return False
    raise ImproperlyConfigured(
        f"Environment variable {name}={value!r} is not a boolean. "
        f"Use one of {', '.join(sorted(TRUE_VALUES))} for true "
        f"or {', '.join(sorted(FALSE_VALUES))} for false."
    )


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    """Read a boolean flag; unset or empty means ``default``."""
    value = _environ(environ).get(name)
    if value is None or not value.strip():
        return default
    return parse_bool(name, value)


def env_list(
    name: str,
    default: str | Iterable[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Read a comma-separated list, dropping blanks: ``"a, b,,c"`` -> ``["a", "b", "c"]``.

    An unset variable gives ``default``; a variable set to the empty string gives
    an empty list, so a default can be switched off on purpose.
    """
    value = _environ(environ).get(name)
    if value is None:
        if isinstance(default, str):
            value = default
        else:
            return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_int(name: str, default: int, *, environ: Mapping[str, str] | None = None) -> int:
    """Read a whole number, 0 or more; unset or empty means ``default``."""
    value = _environ(environ).get(name)
    if value is None or not value.strip():
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ImproperlyConfigured(f"Environment variable {name}={value!r} is not a whole number, 0 or more.")
    return number


def smtp_mailer(url: str, name: str = "SMTP_URL") -> dict:
    """A MAILERS entry for the SMTP server ``url`` names, or an error naming ``name`` and what it should be.

    ``smtp://`` upgrades with STARTTLS, ``smtps://`` speaks TLS from the start; ``smtp+plain://`` sends in
    the clear, and says so in its scheme, for a relay on the same host or network.
    """
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    tls = {"smtp": {"use_tls": True}, "smtps": {"use_ssl": True}, "smtp+plain": {}}.get(parts.scheme)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if tls is None or not parts.hostname or port == -1:
        raise ImproperlyConfigured(
            f"Environment variable {name} must look like smtp://user:password@host:587, smtps://host:465 or "
            f"smtp+plain://host:25, got one with scheme {parts.scheme!r} and host {parts.hostname!r}")
    options: dict = {"host": parts.hostname, **tls}
    if port is not None:
        options["port"] = port
    if parts.username:
        options["username"] = unquote(parts.username)
        options["password"] = unquote(parts.password or "")
    return {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": options}
