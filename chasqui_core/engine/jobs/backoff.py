"""How long a failed job waits before its next attempt.

A ``BackoffSpec`` describes the wait; ``delay_ms`` turns it into a number of
milliseconds for one retry. The default is exponential growth from 100 ms,
doubling each time, capped at 30 s, with +/-100 ms of random jitter::

    delay(n) = min(initial * multiplier ** (n - 1), max) + uniform(-jitter, +jitter)

where ``n`` is the retry number (``n = 1`` is the wait before the second run).
The jitter is added *after* the cap, so that jobs that failed together and hit
the cap together still spread out instead of retrying in lock-step.

This module is pure Python on purpose: it is called once per failed job in the
worker's hot path, and the spec travels inside the msgpack job envelope
(``to_dict``/``from_dict``), so it must stay cheap and free of Django and Redis.

The retry budget (how many attempts a job gets) is not decided here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

from chasqui_core.engine.jobs.errors import RetryAfter

__all__ = [
    "DEFAULT_BACKOFF",
    "JITTER_MODES",
    "BackoffSpec",
    "StrategyFn",
    "coerce_backoff",
    "compute_delay_ms",
    "register_strategy",
]

#: A strategy gets the spec, the retry number (1 or more) and the error the
#: handler raised (or None), and returns the base delay in ms, before jitter.
StrategyFn = Callable[["BackoffSpec", int, "BaseException | None"], float]

JITTER_MODES: frozenset[str] = frozenset(
    {"symmetric", "full", "equal", "decorrelated", "percent", "none"}
)


class _Uniform(Protocol):
    def uniform(self, a: float, b: float, /) -> float: ...


# --- built-in strategies ------------------------------------------------------


def _fixed(spec: BackoffSpec, n: int, error: BaseException | None) -> float:
    # "Fixed" means exactly what the user asked for, so max_ms does not apply.
    return spec.initial_ms


def _exponential(spec: BackoffSpec, n: int, error: BaseException | None) -> float:
    try:
        grown = spec.initial_ms * spec.multiplier ** (n - 1)
    except OverflowError:  # a very high retry number; the cap wins anyway
        grown = math.inf if spec.initial_ms > 0 else 0.0
    return min(grown, spec.max_ms)


def _linear(spec: BackoffSpec, n: int, error: BaseException | None) -> float:
    return min(spec.initial_ms * n, spec.max_ms)


# ``retry_after`` uses exponential for ordinary errors; the RetryAfter case is
# handled in ``delay_ms`` itself because it bypasses jitter and the cap.
_BUILTIN_STRATEGIES: dict[str, StrategyFn] = {
    "exponential": _exponential,
    "fixed": _fixed,
    "linear": _linear,
    "retry_after": _exponential,
}
_STRATEGIES: dict[str, StrategyFn] = dict(_BUILTIN_STRATEGIES)

# Strategies whose growth is bounded by max_ms, so initial_ms above max_ms
# would silently never be used: reject it as a mistake.
_CAPPED = frozenset({"exponential", "linear", "retry_after"})
_NUMBER_FIELDS = ("initial_ms", "multiplier", "max_ms", "jitter_ms", "jitter_percent")


def register_strategy(name: str, fn: StrategyFn) -> None:
    """Make ``fn`` usable as ``BackoffSpec(strategy=name)``.

    ``fn(spec, retry_number, error)`` returns the base delay in milliseconds;
    the spec's jitter mode is applied to it afterwards. ``max_ms`` is *not*
    applied for you: use ``spec.max_ms`` inside ``fn`` if you want a ceiling.

    Register at import time in every process that builds or runs jobs with
    this strategy: a spec naming an unregistered strategy is rejected when it
    is built or decoded. Registering a built-in name raises ``ValueError``
    (their meaning is part of the job format); registering the same custom
    name again replaces the earlier function.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backoff strategy needs a non-empty name, got {name!r}")
    if name in _BUILTIN_STRATEGIES:
        raise ValueError(f"{name!r} is a built-in backoff strategy and cannot be replaced")
    if not callable(fn):
        raise TypeError(f"backoff strategy {name!r} must be a function, got {type(fn).__name__}")
    _STRATEGIES[name] = fn


def _known_strategies() -> str:
    return ", ".join(sorted(_STRATEGIES))


@dataclass(frozen=True, slots=True)
class BackoffSpec:
    """How long to wait before each retry of a job.

    ``strategy`` gives the base delay: ``exponential`` (default), ``fixed``,
    ``linear``, ``retry_after`` (honours a ``RetryAfter`` raised by the
    handler, otherwise exponential) or a name given to ``register_strategy``.
    ``jitter`` then randomises it: ``symmetric`` (default, +/- ``jitter_ms``),
    ``full``, ``equal``, ``decorrelated``, ``percent`` (+/- ``jitter_percent``
    of the base) or ``none``. All times are in milliseconds.
    """

    strategy: str = "exponential"
    initial_ms: float = 100.0
    multiplier: float = 2.0
    max_ms: float = 30_000.0
    jitter: str = "symmetric"
    jitter_ms: float = 100.0
    jitter_percent: float = 0.1

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, str) or self.strategy not in _STRATEGIES:
            raise ValueError(
                f"unknown backoff strategy {self.strategy!r}; known strategies are "
                f"{_known_strategies()} (add your own with register_strategy)"
            )
        if not isinstance(self.jitter, str) or self.jitter not in JITTER_MODES:
            raise ValueError(
                f"unknown jitter mode {self.jitter!r}; known modes are "
                f"{', '.join(sorted(JITTER_MODES))}"
            )
        for name in _NUMBER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"backoff {name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"backoff {name} must be a finite number of 0 or more, got {value!r}")
            # Store floats so that equal specs compare and serialise the same
            # whether the user wrote 500 or 500.0.
            object.__setattr__(self, name, float(value))
        if self.strategy in ("exponential", "retry_after") and self.multiplier < 1:
            raise ValueError(
                f"backoff multiplier must be 1 or more, or delays would shrink; got {self.multiplier:g}"
            )
        if self.jitter_percent > 1:
            raise ValueError(
                f"backoff jitter_percent is a fraction (0.1 means +/-10%) and must be at most 1; "
                f"got {self.jitter_percent:g}"
            )
        if (self.strategy in _CAPPED or self.jitter == "decorrelated") and self.initial_ms > self.max_ms:
            raise ValueError(
                f"backoff initial_ms ({self.initial_ms:g}) is above max_ms ({self.max_ms:g}); "
                f"raise max_ms too, or every delay would be max_ms"
            )

    @classmethod
    def fixed(cls, ms: float) -> BackoffSpec:
        """Wait exactly ``ms`` milliseconds before every retry, with no jitter."""
        return cls(strategy="fixed", initial_ms=ms, jitter="none")

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults, for the job envelope.

        Most jobs use the default spec, which encodes as ``{}``. Whole numbers
        are written as ints, which msgpack stores in fewer bytes than floats.
        """
        out: dict[str, Any] = {}
        for name, default in _DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
                    value = int(value)
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackoffSpec:
        """Rebuild a spec from ``to_dict`` output (missing keys take the defaults)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a backoff dict must be a mapping, got {type(data).__name__}")
        unknown = [key for key in data if key not in _DEFAULTS]
        if unknown:
            raise ValueError(
                f"unknown backoff field(s) {', '.join(map(repr, unknown))}; "
                f"known fields are {', '.join(_DEFAULTS)}"
            )
        return cls(**data)

    def delay_ms(
        self,
        retry_number: int,
        *,
        error: BaseException | None = None,
        previous_ms: int | None = None,
        rng: _Uniform | None = None,
    ) -> int:
        """Milliseconds to wait before retry number ``retry_number`` (1 or more).

        ``error`` is what the handler raised (used by ``retry_after`` and by
        custom strategies). ``previous_ms`` is the delay used before the last
        retry of this job, used by ``decorrelated`` jitter. ``rng`` defaults to
        the ``random`` module; pass a seeded ``random.Random`` for tests.
        """
        if retry_number < 1:
            raise ValueError(
                f"retry_number starts at 1 (the wait before the second run); the first run "
                f"has no backoff, got {retry_number!r}"
            )
        if self.strategy == "retry_after" and isinstance(error, RetryAfter):
            # The server asked for this exact wait: no jitter, no cap.
            return max(0, round(error.seconds * 1000))

        base = _STRATEGIES[self.strategy](self, retry_number, error)
        if not 0 <= base < math.inf:  # also catches NaN from a custom strategy
            raise ValueError(
                f"backoff strategy {self.strategy!r} returned {base!r}; it must return "
                f"a finite number of milliseconds, 0 or more"
            )
        r = random if rng is None else rng
        jitter = self.jitter
        if jitter == "symmetric":
            delay = base + r.uniform(-self.jitter_ms, self.jitter_ms)
        elif jitter == "none":
            delay = base
        elif jitter == "full":
            delay = r.uniform(0.0, base)
        elif jitter == "equal":
            half = base / 2
            delay = half + r.uniform(0.0, half)
        elif jitter == "percent":
            p = self.jitter_percent
            delay = base * (1 + r.uniform(-p, p))
        else:  # decorrelated (AWS): ignores the strategy's base on purpose
            # Never let a short previous wait (a RetryAfter(0), say) pull the
            # range below initial_ms.
            prev = self.initial_ms if previous_ms is None else max(previous_ms, self.initial_ms)
            delay = min(self.max_ms, r.uniform(self.initial_ms, prev * 3))
        return max(0, round(delay))


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(BackoffSpec)}

DEFAULT_BACKOFF = BackoffSpec()


def coerce_backoff(value: object) -> BackoffSpec | None:
    """Turn what a user may pass as ``backoff=`` into a spec.

    ``None`` stays ``None`` (meaning "the default"); a ``BackoffSpec`` is used
    as is; a number is a fixed wait in milliseconds; a string is a strategy
    name with default settings; a dict is a set of ``BackoffSpec`` fields.
    """
    if value is None or isinstance(value, BackoffSpec):
        return value
    if isinstance(value, bool):  # bool is an int subclass; True is not 1 ms
        raise TypeError("backoff cannot be True or False; give a number of milliseconds or a BackoffSpec")
    if isinstance(value, (int, float)):
        return BackoffSpec.fixed(value)
    if isinstance(value, str):
        return BackoffSpec(strategy=value)
    if isinstance(value, Mapping):
        return BackoffSpec.from_dict(value)
    raise TypeError(
        "backoff must be None, a BackoffSpec, a number of milliseconds, a strategy name "
        f"or a dict of BackoffSpec fields; got {type(value).__name__}"
    )


def compute_delay_ms(
    spec: BackoffSpec | None,
    retry_number: int,
    *,
    error: BaseException | None = None,
    previous_ms: int | None = None,
    rng: _Uniform | None = None,
) -> int:
    """``spec.delay_ms(...)``, with ``None`` meaning ``DEFAULT_BACKOFF``."""
    if spec is None:
        spec = DEFAULT_BACKOFF
    return spec.delay_ms(retry_number, error=error, previous_ms=previous_ms, rng=rng)
