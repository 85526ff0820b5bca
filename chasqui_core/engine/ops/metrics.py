"""Counter time series of a queue, read from the time-bucketed hashes the
engine's Lua scripts increment (``<metrics>s:<epoch second>`` and
``<metrics>m:<epoch minute>``).

Buckets are keyed by the server's clock, the same clock the scripts used to
pick them, so by default the window ends at the server's "now". A bucket
nobody wrote to (or that expired) reads as zero, so every series is complete
and evenly spaced, ready to plot.
"""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys

FIELDS = ("enqueued", "completed", "failed", "retried", "dlq", "promoted")

SECOND_BUCKET_TTL_S = 3720
"""Lifetime of a per-second bucket: the hour the console plots, plus two minutes of slack."""
MINUTE_BUCKET_TTL_S = 90_000
"""Lifetime of a per-minute bucket: a day, plus an hour of slack.

The Lua scripts set both lifetimes (``lua/prelude.lua``); scripts.py writes
these values into the prelude when it loads it.
"""


@dataclass(frozen=True, slots=True)
class _Resolution:
    step_ms: int
    default_window: int
    max_window: int
    """Buckets older than this many steps have expired (see the bucket lifetimes above)."""


RESOLUTIONS = {
    "second": _Resolution(1000, 3600, SECOND_BUCKET_TTL_S),
    "minute": _Resolution(60_000, 1440, MINUTE_BUCKET_TTL_S // 60),
}


@dataclass(frozen=True, slots=True)
class Series:
    queue: str
    resolution: str
    """"second" or "minute"."""
    start_ms: int
    """Start of the oldest bucket (epoch ms, server clock)."""
    step_ms: int
    points: dict[str, list[int]]
    """One list per field of FIELDS, oldest bucket first; the last one is the bucket still filling."""

    def _field(self, field: str) -> list[int]:
        try:
            return self.points[field]
        except KeyError:
            raise ValueError(f"Unknown counter {field!r}: choose one of {', '.join(FIELDS)}") from None

    def total(self, field: str) -> int:
        return sum(self._field(field))

    def rate(self, field: str, last_n: int = 60) -> float:
        """Events per second over the last ``last_n`` buckets (fewer when the series is shorter)."""
        if isinstance(last_n, bool) or not isinstance(last_n, int) or last_n < 1:
            raise ValueError(f"last_n must be a whole number of 1 or more, got {last_n!r}")
        values = self._field(field)[-last_n:]
        if not values:
            return 0.0
        return sum(values) * 1000 / (len(values) * self.step_ms)


def _check(resolution: str, window: int | None) -> tuple[_Resolution, int]:
    res = RESOLUTIONS.get(resolution) if isinstance(resolution, str) else None
    if res is None:
        raise ValueError(f"Unknown resolution {resolution!r}: use 'second' or 'minute'")
    if window is None:
        return res, res.default_window
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= res.max_window:
        raise ValueError(
            f"window must be a whole number of points from 1 to {res.max_window} at {resolution!r} "
            f"resolution (older counters have expired), got {window!r}"
        )
    return res, window


def _server_ms(client: Client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def multi_series(
    client: Client,
    queues: list[str],
    *,
    resolution: str = "second",
    window: int | None = None,
    now_ms: int | None = None,
) -> dict[str, Series]:
    """The same window for several queues, read in one pipeline.

    Without ``now_ms`` the server's clock is read first (one more round trip).
    """
    res, window = _check(resolution, window)
    all_keys = [QueueKeys.for_queue(q) for q in dict.fromkeys(queues)]
    if not all_keys:
        return {}
    now = _server_ms(client) if now_ms is None else int(now_ms)
    last = now // res.step_ms
    first = last - window + 1
    pipe = client.pipeline(transaction=False)
    for k in all_keys:
        prefix = k.second_counters if resolution == "second" else k.minute_counters
        for bucket in range(first, last + 1):
            pipe.hgetall(prefix + str(bucket))
    replies = pipe.execute()
    out = {}
    for i, k in enumerate(all_keys):
        points: dict[str, list[int]] = {f: [0] * window for f in FIELDS}
        for j, bucket in enumerate(replies[i * window:(i + 1) * window]):
            for name, value in bucket.items():
                field = name.decode() if isinstance(name, bytes) else name
                if field in points:
                    points[field][j] = int(value)
        out[k.queue] = Series(k.queue, resolution, first * res.step_ms, res.step_ms, points)
    return out


def series(
    client: Client,
    queue: str,
    *,
    resolution: str = "second",
    window: int | None = None,
    now_ms: int | None = None,
) -> Series:
    """``window`` buckets ending with the one holding ``now_ms`` (default: the server's now).

    Default window: the last hour of seconds, or the last day of minutes.
    """
    return multi_series(client, [queue], resolution=resolution, window=window, now_ms=now_ms)[queue]


def spike(
    series: Series,
    field: str = "retried",
    *,
    recent: int = 10,
    baseline: int = 300,
    factor: float = 3.0,
    min_rate: float = 1.0,
) -> bool:
    """True when a counter runs well above its own recent past.

    Compares the mean per bucket over the last ``recent`` buckets with the mean
    over the ``baseline`` buckets before them (fewer when the series is
    shorter): a spike needs at least ``factor`` times the baseline and at least
    ``min_rate`` per bucket, so a quiet queue going from 0 to 0.1 is not one.
    Without any baseline bucket there is nothing to compare with: False.
    """
    for name, value in (("recent", recent), ("baseline", baseline)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of 1 or more, got {value!r}")
    values = series._field(field)
    if len(values) <= recent:
        return False
    now_part = values[-recent:]
    before = values[-recent - baseline:-recent]
    recent_mean = sum(now_part) / len(now_part)
    baseline_mean = sum(before) / len(before)
    return recent_mean >= min_rate and recent_mean >= factor * baseline_mean
