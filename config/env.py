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
