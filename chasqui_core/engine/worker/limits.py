"""Rate and concurrency limits, held in Redis for every worker of a queue at once.

A limit names a queue (every job on it) or a task (its jobs on whatever
queue): at most N starts per second, minute or hour (``rate``), at most N
runs at once (``concurrency``), or both. With ``key`` it holds per value of one
of the job's keyword arguments (one customer's calls, say), or per the
``limit_key`` a caller gave the job, each value a bucket of its own.

The worker checks a batch's limited jobs in one Lua call (lua/limit_take.lua)
right after reading them: a job either takes a slot in every bucket it falls
under, or goes to the delayed set, its envelope untouched, due when its
buckets will have room. Waiting costs it no attempt and holds no worker slot.

A rate limit promises starts, not reads: at most N jobs start in any window.
A job admitted at read may wait in its worker before it starts, so a rate
token holds for a short grace only: a job not started by then
(``LimitGate.late``) takes its token again before it starts
(``LimitGate.retake``: it starts now, or waits in the delayed set like any
job the limit holds back). A token is scored by the end of its grace and
counts against the window from there, which keeps any W of starts to N. The
grace is ``START_GRACE_MS`` plus twice the round trips the worker sees: a
fixed grace shorter than a slow link's round trip would send every job back
for a token, forever.
A run's concurrency slots are given back when it ends (lua/limit_release.lua,
which also wakes one parked job per slot); the lease pass renews the slots of
runs still going, so a dead worker's slots lapse after one lease.

Every bucket lives under its queue's hash tag, so the check is one call on
one cluster slot; the price is that a task's limit is counted per queue it
runs on. Jobs with no limit never reach this module's Redis calls.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from chasqui_core.engine.jobs.envelope import Job, now_ms
from chasqui_core.engine.worker.delivery import Bucket, Delivery
from chasqui_core.engine.store.keys import GROUP, QueueKeys

if TYPE_CHECKING:
    from chasqui_core.engine.store.connection import Client
    from chasqui_core.engine.store.scripts import Scripts

LIMIT_KEY_META = "limit_key"
"""The key of a job's own bucket value in its envelope's ``meta``: ``Queue.add(limit_key=...)``."""

_WINDOWS_MS = {
    "s": 1_000, "sec": 1_000, "second": 1_000,
    "m": 60_000, "min": 60_000, "minute": 60_000,
    "h": 3_600_000, "hour": 3_600_000,
}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*$")
_pack = msgpack.Packer(use_bin_type=False).pack
"""Bytes as msgpack raw strings: the form the server's cmsgpack reads."""
_PLAIN_BUCKET = re.compile(r"^[A-Za-z0-9_.@+\-]{1,64}\Z")
NO_VALUE_BUCKET = "-"
"""The bucket of a keyed limit's jobs that carry no value for its key: they share one."""


class LimitError(ValueError):
    """A limit that cannot be enforced as written."""


def parse_rate(text: object, where: str = "rate") -> tuple[int, int]:
    """``"20/s"``, ``"100/m"``, ``"5/10s"``, ``"1000/hour"`` as (jobs, window in ms)."""
    m = _RATE.match(text) if isinstance(text, str) else None
    unit = _WINDOWS_MS.get(m.group(3)) if m else None
    if m is None or unit is None or int(m.group(1)) < 1 or m.group(2) == "0":
        raise LimitError(f"{where} must read like '20/s', '100/m', '5/10s' or '1000/h' (jobs per second, "
                         f"minute or hour), got {text!r}")
    return int(m.group(1)), unit * int(m.group(2) or 1)


@dataclass(frozen=True, slots=True)
class Limit:
    scope: str
    """A queue name or a task path."""
    rate: int = 0
    """Starts allowed in any window of ``window_ms``; 0: no rate limit."""
    window_ms: int = 0
    concurrency: int = 0
    """Runs allowed at once; 0: no concurrency limit."""
    key: str | None = None
    """The keyword argument whose value picks the bucket; None: one bucket for the scope."""

    @classmethod
    def parse(cls, scope: object, spec: object) -> Limit:
        """One entry of ``CHASQUI["LIMITS"]``; raises LimitError saying what is wrong."""
        if not isinstance(scope, str) or not scope or ":" in scope or len(scope) > 200:
            raise LimitError(f"a limit is named by a queue name or a task path, got {scope!r}")
        where = f"LIMITS[{scope!r}]"
        if not isinstance(spec, Mapping):
            raise LimitError(f"{where} must be a dict such as {{'rate': '20/s', 'concurrency': 2}}, got {spec!r}")
        unknown = set(spec) - {"rate", "concurrency", "key"}
        if unknown:
            raise LimitError(f"{where} has unknown settings {sorted(map(str, unknown))}: use 'rate', "
                             "'concurrency' and 'key'")
        rate = window = 0
        if spec.get("rate") is not None:
            rate, window = parse_rate(spec["rate"], f"{where}['rate']")
        concurrency = spec.get("concurrency") or 0
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0:
            raise LimitError(f"{where}['concurrency'] must be a whole number of 1 or more, got {concurrency!r}")
        if not rate and not concurrency:
            raise LimitError(f"{where} limits nothing: give 'rate', 'concurrency' or both")
        key = spec.get("key")
        if key is not None and (not isinstance(key, str) or not key.isidentifier()):
            raise LimitError(f"{where}['key'] must name a keyword argument of the task, got {key!r}")
        return cls(scope, rate, window, concurrency, key)

    def describe(self) -> str:
        parts = []
        if self.rate:
            parts.append(f"{self.rate} per {self.window_ms / 1000:g} s")
        if self.concurrency:
            parts.append(f"{self.concurrency} at once")
        text = ", ".join(parts)
        return f"{text} per {self.key}" if self.key else text


def parse_limits(setting: Mapping[str, Any] | Iterable[Limit] | None) -> list[Limit]:
    """``CHASQUI["LIMITS"]`` (or a list of limits) as a list of limits; raises LimitError."""
    if setting is None:
        return []
    if isinstance(setting, Mapping):
        return [Limit.parse(scope, spec) for scope, spec in setting.items()]
    limits = list(setting)
    for item in limits:
        if not isinstance(item, Limit):
            raise LimitError(f"limits must be a dict of queue or task name to settings, got {item!r}")
    return limits


def bucket_name(value: object) -> str:
    """A bucket's name in a Redis key: the value itself when short and plain, else a digest of it."""
    text = value if isinstance(value, str) else repr(value)
    if _PLAIN_BUCKET.match(text):
        return text
    return "#" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()



START_GRACE_MS = 50
"""How long after its rate token's reply a job may still start on it (see the module's docstring), on top of
twice the round trip the take is expected to take. A token counts against its window for its grace too, so a
rate of N per W admits N per W + the grace at most: 5 % below N at one second on a fast link, nothing to speak
of over a minute; a shorter grace sends more jobs back for a token."""

MAX_GRACE_MS = 10_000
"""The longest grace asked for, whatever the round trips: a link that slow holds tokens no longer than this."""


SLOT_MARGIN_MS = 500
"""A concurrency slot is trusted to start a job on until this long before its lease could lapse: past that, with
no renewal heard, another worker may hold it (its lease lapsed while this one was cut off), and the job takes a
slot again before it starts (``LimitGate.late``)."""


class Limits:
    """The limits one worker enforces, and which buckets each job it reads falls under."""

    def __init__(self, limits: Iterable[Limit], queues: Iterable[str]) -> None:
        queue_names = set(queues)
        self.limits = list(limits)
        self.by_queue: dict[str, Limit] = {}
        self.by_task: dict[str, Limit] = {}
        for limit in self.limits:
            table = self.by_queue if limit.scope in queue_names else self.by_task
            if limit.scope in table:
                raise LimitError(f"two limits are named {limit.scope!r}")
            table[limit.scope] = limit

    def __bool__(self) -> bool:
        return bool(self.limits)

    def buckets(self, keys: QueueKeys, job: Job) -> tuple[Bucket, ...] | None:
        """The buckets a job falls under on this queue; None when it has no limit."""
        on_queue = self.by_queue.get(keys.queue)
        on_task = self.by_task.get(job.task)
        if on_queue is None and on_task is None:
            return None
        return tuple(self._bucket(keys, limit, job) for limit in (on_queue, on_task) if limit is not None)

    @staticmethod
    def _bucket(keys: QueueKeys, limit: Limit, job: Job) -> Bucket:
        name = "all"
        if limit.key is not None:
            value = job.meta.get(LIMIT_KEY_META)
            if value is None:
                value = job.kwargs.get(limit.key)
            name = NO_VALUE_BUCKET if value is None else bucket_name(value)
        return (keys.limit(limit.scope, name), limit.rate, limit.window_ms, limit.concurrency)


@dataclass(frozen=True, slots=True)
class Taken:
    admitted: list[Delivery]
    parked: int
    """Jobs acknowledged and put in the delayed set until their limits have room."""
    earliest_ms: int
    """When the first parked job is due (server clock); -1 when none was parked."""
    server_ms: int


class LimitGate:
    """The worker's side of the limit scripts (asyncio client)."""

    def __init__(self, scripts: Scripts, slot_ms: int) -> None:
        self.scripts = scripts
        self.slot_ms = slot_ms
        """A concurrency slot's lifetime without renewal: the visibility timeout, renewed by each lease pass."""
        self.skew_ms = 0
        """The server's clock minus this process's, as of the last take."""
        self.round_trip_ms = 0.0
        """The slowest recent take's round trip, decaying: what the grace of the next take allows for."""

    async def take(self, keys: QueueKeys, deliveries: list[Delivery]) -> Taken:
        """Give each delivery a slot in all its buckets, or park it (one Lua call for the batch).

        An admitted delivery under a rate limit must start by its ``rate_by`` (``late`` says when it did not).
        """
        return await self._call(keys, deliveries, retake=False)

    @staticmethod
    def late(d: Delivery) -> bool:
        """Did ``d`` miss the start its rate token allowed, or may its concurrency slot have lapsed while it
        waited? Then it must not start before ``retake``: a limit is a promise about starts."""
        now = time.monotonic()
        return 0.0 < d.rate_by < now or 0.0 < d.slot_until < now

    async def retake(self, keys: QueueKeys, deliveries: list[Delivery]) -> Taken:
        """Take again the rate tokens of deliveries about to start late (one Lua call for them all).

        Each drops its old token and is checked like a new job: admitted ones
        start now (a new ``rate_by``); the others are acknowledged and wait in
        the delayed set, uncharged, as at read. The concurrency slots they hold
        are kept, unless their lease may have lapsed (``slot_until`` passed):
        those are taken again. The caller gives back the slots of the jobs that
        wait (``release``), and lets go of those jobs.
        """
        return await self._call(keys, deliveries, retake=True)

    async def _call(self, keys: QueueKeys, deliveries: list[Delivery], *, retake: bool) -> Taken:
        index: dict[Bucket, int] = {}
        flat_buckets: list[Any] = []
        flat_jobs: list[Any] = []
        now = time.monotonic()
        for d in deliveries:
            mine = []
            lapsed = not retake or 0.0 < d.slot_until < now  # (re)take its concurrency slots too
            for bucket in d.limits or ():
                if not lapsed:
                    if not bucket[1]:
                        continue
                    bucket = (bucket[0], bucket[1], bucket[2], 0)  # its concurrency slot is held already
                at = index.get(bucket)
                if at is None:
                    at = index[bucket] = len(index) + 1
                    flat_buckets.extend(bucket)
                mine.append(at)
            flat_jobs += (d.entry_id, d.payload, mine)
        grace = min(START_GRACE_MS + int(2 * self.round_trip_ms), MAX_GRACE_MS)
        sent = time.monotonic()
        server_ms, positions, parked, earliest = await self.scripts.limit_take(
            keys=[keys.stream, keys.delayed, keys.limits],
            args=[GROUP, keys.metrics, self.slot_ms, _pack(flat_buckets), _pack(flat_jobs),
                  slot_prefix(keys), grace, "1" if retake else "0", MAX_GRACE_MS])
        answered = time.monotonic()
        self.round_trip_ms = max((answered - sent) * 1000, self.round_trip_ms * 0.8)
        self.skew_ms = int(server_ms) - now_ms()
        admitted = [deliveries[p - 1] for p in positions]
        start_by = sent + (grace - 1) / 1000  # the token is scored grace after ``sent`` at the earliest, in whole ms
        held_until = sent + (self.slot_ms - SLOT_MARGIN_MS) / 1000
        for d in admitted:
            d.rate_by = start_by if any(b[1] for b in d.limits or ()) else 0.0
            if not retake or 0.0 < d.slot_until < now:
                d.slots = tuple(b[0] for b in d.limits or () if b[3])
                d.slot_until = held_until if d.slots else 0.0
        return Taken(admitted, int(parked), int(earliest), int(server_ms))

    async def release(self, keys: QueueKeys, deliveries: Iterable[Delivery]) -> None:
        """Give back the concurrency slots of ended runs, waking one parked job per slot."""
        args: list[Any] = []
        for d in deliveries:
            for prefix in d.slots:
                args += (prefix, slot_member(d))
        if args:
            await self.scripts.limit_release(keys=[keys.delayed], args=args)

    async def renew(self, client: Client, deliveries: Iterable[Delivery], now_ms: int) -> None:
        """Push back the lapse of the slots of runs still going (their holder is alive).

        Slots lapse on the server's clock; ``now_ms`` is this process's, moved onto the server's by the
        offset seen at the last take.
        """
        now_ms += self.skew_ms
        pipe = None
        renewed: list[Delivery] = []
        for d in deliveries:
            for prefix in d.slots:
                if pipe is None:
                    pipe = client.pipeline(transaction=False)
                pipe.zadd(prefix + "running", {slot_member(d): now_ms + self.slot_ms}, xx=True, gt=True, ch=True)
                renewed.append(d)
        if pipe is None:
            return
        sent = time.monotonic()
        replies = await pipe.execute()
        held_until = sent + (self.slot_ms - SLOT_MARGIN_MS) / 1000
        lost = {d for d, changed in zip(renewed, replies, strict=True) if not changed}
        for d in renewed:
            if d not in lost:
                d.slot_until = held_until
            elif not d.started:  # gone (it lapsed, and another worker may hold it): taken again before it starts
                d.slot_until = min(d.slot_until, sent)


def slot_prefix(keys: QueueKeys) -> bytes:
    """What goes before a run's stream id in its buckets' sets: its priority band's name for a band's stream
    (``<band>:<id>``), since stream ids repeat across a queue's streams; nothing for the default band's."""
    return keys.band.encode() + b":" if keys.band else b""


def slot_member(d: Delivery) -> bytes:
    """A run's member in its buckets' sets (limit_take.lua writes the same, given ``slot_prefix``)."""
    return slot_prefix(d.keys) + d.entry_id


# --- reading the state of the limits (console, API, /metrics) ------------------------------------


@dataclass(frozen=True, slots=True)
class BucketState:
    scope: str
    """The limit's queue name or task path."""
    bucket: str
    """``all`` for a limit without a key; else the key's value (or its digest)."""
    started: int
    """Starts within the last window of a rate limit (0 when the limit has no rate)."""
    running: int
    """Concurrency slots held now."""
    waiting: int
    """Jobs in the delayed set until this bucket has room."""


def read_buckets(client: Client, keys: QueueKeys, windows: Mapping[str, int] | None = None) -> list[BucketState]:
    """The state of every limit bucket used on a queue, busiest first, in two round trips.

    ``windows`` gives each scope's rate window in ms (from the setting); a
    scope without one counts the starts its rate set still holds. Buckets
    whose keys have all lapsed leave the queue's set of buckets here.
    """
    prefixes = sorted(p.decode() if isinstance(p, bytes) else p for p in client.smembers(keys.limits))
    if not prefixes:
        return []
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    windows = windows or {}
    pipe = client.pipeline(transaction=False)
    named = []
    for prefix in prefixes:
        scope, _, bucket = prefix[len(keys.prefix) + len("limit:"):-1].rpartition(":")
        named.append((prefix, scope, bucket))
        window = windows.get(scope)
        pipe.zcount(prefix + "rate", now - window if window else "-inf", "+inf")
        pipe.zcount(prefix + "running", now, "+inf")
        pipe.zcount(prefix + "waiting", now, "+inf")
        pipe.exists(prefix + "rate", prefix + "running", prefix + "waiting", prefix + "parked")
    replies = pipe.execute()
    states, gone = [], []
    for i, (prefix, scope, bucket) in enumerate(named):
        started, running, waiting, exists = replies[i * 4:i * 4 + 4]
        if not exists:
            gone.append(prefix)
            continue
        states.append(BucketState(scope, bucket, int(started), int(running), int(waiting)))
    if gone:
        client.srem(keys.limits, *gone)
    states.sort(key=lambda s: (-(s.waiting + s.running + s.started), s.scope, s.bucket))
    return states
