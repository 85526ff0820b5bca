"""Where a queue lives in Redis.

Every key of a queue carries the hash tag ``{chasqui:<queue>}``, so all of a
queue's keys fall in one Redis Cluster slot and each Lua script touches one
slot only. Counters are bucketed by time under the same tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from chasqui_core.engine.jobs.errors import InvalidQueueName

GROUP = "chasqui"
"""The consumer group every worker of a queue joins."""

SECOND_BUCKET = "s:"
"""What follows a queue's ``metrics`` prefix in a per-second counter bucket's key, before the epoch second."""
MINUTE_BUCKET = "m:"
"""What follows a queue's ``metrics`` prefix in a per-minute counter bucket's key, before the epoch minute.

The Lua scripts build bucket keys themselves (``lua/prelude.lua``); scripts.py
writes these two parts into the prelude when it loads it.
"""
TOTALS = "total"
"""What follows a queue's ``metrics`` prefix in the key of its all-time counters (written into the prelude too)."""
DURATIONS = "durations"
"""What follows a queue's ``metrics`` prefix in the key of its run-duration histograms."""
SNAPSHOT_5M = "snap:5m:"
"""What follows a queue's ``metrics`` prefix in a 5-minute snapshot of its totals and histograms (history.py)."""
SNAPSHOT_1H = "snap:1h:"
"""What follows a queue's ``metrics`` prefix in an hourly snapshot of its totals and histograms (history.py)."""

DLQ_INDEX_VERSION = "2"
"""The layout of a DLQ's index (``dlq/index.py``, ``lua/dlq_index.lua``): an index of another version is rebuilt.
The scripts that keep the index record it when they first write one, so a queue indexed from its first dead job
is never rebuilt."""


HIGH = "high"
LOW = "low"
BANDS = (HIGH, "", LOW)
"""A queue's priority bands, highest first; "" is the default band, the queue's own stream (priority.py)."""

DELAYED = "delayed"
"""What follows a queue's prefix in its delayed set's key (a sorted set of envelopes scored by due ms)."""
DELAYED_MARK = "djob:"
"""What follows a queue's prefix in a delayed job's mark, before the job id: ``<prefix>djob:<job id>`` holds the
score the job was last given in the delayed set, so a lookup by id reads it instead of scanning the set. Every
script that adds to the delayed set writes it (``mark_delayed`` in ``lua/prelude.lua``, which builds the key from
the delayed set's name and these two parts); it expires ``DELAYED_MARK_GRACE_MS`` after the job is due and is not
deleted when the job leaves the set, so a reader checks it against the set (lookup.py)."""
DELAYED_MARK_GRACE_MS = 86_400_000
"""How long a delayed job's mark outlives the job's due time: a day, for a promoter that is down a while."""
REPLAY_MARK = "rjob:"
"""What follows a queue's prefix in a replayed job's mark: ``<prefix>rjob:<job id>`` holds ``"<band> <entry id>"``,
the stream entry ``dlq_move.lua`` gave the job, so a lookup by id reads that entry rather than scanning the stream
(the entry left the DLQ's index with the replay). It expires after ``REPLAY_MARK_TTL_MS``; a reader checks it."""
REPLAY_MARK_TTL_MS = 86_400_000
"""How long a replayed job's mark lives: a day."""


QUEUE_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,100}$"
"""What a queue name may be, as a JSON Schema pattern (the API's schema publishes it)."""
_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN[:-1] + r"\Z")


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise InvalidQueueName(
            f"Queue name {name!r} is not valid: use 1 to 100 letters, digits, '_', '-' or '.'"
        )
    return name


@dataclass(frozen=True, slots=True)
class QueueKeys:
    queue: str
    prefix: str
    stream: str
    delayed: str
    dlq: str
    events: str
    promoter_lock: str
    workers: str
    paused: str
    unique: str
    """Prefix of the idempotency markers written for adds with a caller-given job id."""
    done: str
    """Prefix of the execution idempotency markers: ``<done><key>`` holds the id of the job that completed
    the key (see idempotency.py)."""
    result: str
    """Prefix of stored results (when result storage is on)."""
    metrics: str
    """Prefix of the time-bucketed counters, as the Lua scripts get it (they add the bucket part and the time)."""
    second_counters: str
    """Prefix of the per-second counter buckets: ``<second_counters><epoch second>`` is a hash of counters."""
    minute_counters: str
    """Prefix of the per-minute counter buckets: ``<minute_counters><epoch minute>``."""
    totals: str
    """All-time counters (``<metrics><TOTALS>``), bumped by the prelude's ``bump_counters`` with every bucket."""
    durations: str
    """Run-duration histogram per task (``<metrics><DURATIONS>``), written by settle.lua: see totals.py."""
    lane: str
    """Prefix of the producer lanes: ``<lane><lane id>`` holds the last write of one lane
    (see engine/producer/link.py)."""
    cancel: str
    """Cancel requests: a hash job id -> requested ms (cancel.py), read at pickup and while jobs run."""
    cancel_version: str
    """Bumped with every change to ``cancel``: a worker keeps a copy of the record while this stays the same."""
    progress: str
    """Prefix of the progress reports of running jobs: ``<progress><job id>``, with a TTL (cancel.py)."""
    console_depth: str
    """The console's samples of the delayed set's size: a sorted set written by ``dashboard/readings.py``."""
    bands: str
    """The set of priority bands ("high", "low") a job was ever added to: their streams exist and are read."""
    band: str = ""
    """Which priority band's stream ``stream`` is: "" for the default band (every QueueKeys but ``in_band``'s)."""
    rank: int = 1
    """The band's place, highest first (0 high, 1 default, 2 low): the worker's inboxes are indexed by it."""

    @classmethod
    def for_queue(cls, queue: str) -> QueueKeys:
        validate_queue_name(queue)
        p = f"{{chasqui:{queue}}}:"
        return cls(
            queue=queue,
            prefix=p,
            stream=p + "stream",
            delayed=p + DELAYED,
            dlq=p + "dlq",
            events=p + "events",
            promoter_lock=p + "promoter:lock",
            workers=p + "workers",
            paused=p + "paused",
            unique=p + "unique:",
            done=p + "done:",
            result=p + "result:",
            metrics=p + "m:",
            second_counters=p + "m:" + SECOND_BUCKET,
            minute_counters=p + "m:" + MINUTE_BUCKET,
            totals=p + "m:" + TOTALS,
            durations=p + "m:" + DURATIONS,
            lane=p + "lane:",
            cancel=p + "cancel",
            cancel_version=p + "cancel:v",
            progress=p + "progress:",
            console_depth=p + "console:depth",
            bands=p + "bands",
        )

    def in_band(self, band: str) -> QueueKeys:
        """These keys with ``stream`` the given priority band's stream (``{chasqui:<q>}:stream:high``).

        Every other key is the queue's own: a band shares the queue's delayed
        set, dead-letter queue, counters and cancel record. The start journal
        (``running``) is per band, since entry ids repeat across streams.
        """
        if band == self.band:
            return self
        if band not in BANDS:
            raise ValueError(f"unknown priority band {band!r}: use one of 'high', '' (default) and 'low'")
        base = self.prefix + "stream"
        return replace(self, stream=f"{base}:{band}" if band else base, band=band, rank=BANDS.index(band))

    def band_keys(self, bands: Iterable[str]) -> list[QueueKeys]:
        """Keys of the default band and of ``bands`` (names read from ``bands``), highest band first."""
        present = set(bands) | {""}
        return [self.in_band(b) for b in BANDS if b in present]

    def delayed_mark(self, job_id: str) -> str:
        """A delayed job's mark: its score in the delayed set, written with it (see ``DELAYED_MARK``)."""
        return f"{self.prefix}{DELAYED_MARK}{job_id}"

    def replay_mark(self, job_id: str) -> str:
        """A replayed job's mark: the stream entry the replay gave it (see ``REPLAY_MARK``)."""
        return f"{self.prefix}{REPLAY_MARK}{job_id}"

    @property
    def replay_marks(self) -> str:
        """The prefix of the queue's replay marks (what ``dlq_move.lua`` adds the job id to)."""
        return f"{self.prefix}{REPLAY_MARK}"

    def alive(self, worker_id: str) -> str:
        """A worker's alive key on this queue: set with a TTL by each lease pass (recovery.py, lease.lua)."""
        return f"{self.prefix}alive:{worker_id}"

    @property
    def limits(self) -> str:
        """The set of the key prefixes of every limit bucket used on this queue (limits.py)."""
        return f"{self.prefix}limits"

    def limit(self, scope: str, bucket: str) -> str:
        """Key prefix of one bucket of a rate or concurrency limit on this queue (limits.py): ``rate``,
        ``running``, ``waiting`` and ``parked`` follow it."""
        return f"{self.prefix}limit:{scope}:{bucket}:"

    @property
    def operations(self) -> str:
        """The set of unfinished DLQ operations (replays/discards by filter), by id, scored by creation ms."""
        return f"{self.prefix}ops"

    def operation(self, op_id: str) -> str:
        """One DLQ operation's record: a hash of its definition and progress (dlq/operations.py)."""
        return f"{self.prefix}op:{op_id}"

    def running(self, worker_id: str) -> str:
        """A worker's start journal on this queue: entry id -> start ms of each run under way (journal.py)."""
        return f"{self.prefix}running-{self.band}:{worker_id}" if self.band else f"{self.prefix}running:{worker_id}"

    @property
    def running_prefix(self) -> str:
        """``running(worker)`` without the worker: the prefix reclaim.lua adds a dead worker's id to."""
        return self.running("")

    def ended(self, worker_id: str) -> str:
        """The runs a dead worker noted ended on its host (ended_runs.py), as its death's recorder wrote them here (a
        set of entry ids, with the death record's TTL): a start mark the network delivers after the recorder struck
        it does not make that run a death (reclaim.lua). Per band, like ``running``."""
        return f"{self.prefix}ended-{self.band}:{worker_id}" if self.band else f"{self.prefix}ended:{worker_id}"

    @property
    def ended_prefix(self) -> str:
        """``ended(worker)`` without the worker: the prefix reclaim.lua adds an owner's id to."""
        return self.ended("")

    def dispatching(self, worker_id: str) -> str:
        """The entry ids a worker is about to start on this stream, in one round of its event loop (a set, written
        just before the round and deleted after it): a process that dies in the round takes back those, and only
        those, as possibly started (reclaim.lua, ``recovered``). Per band, like ``running``."""
        return (f"{self.prefix}dispatching-{self.band}:{worker_id}" if self.band
                else f"{self.prefix}dispatching:{worker_id}")

    @property
    def dispatching_prefix(self) -> str:
        """``dispatching(worker)`` without the worker: the prefix reclaim.lua adds an owner's id to."""
        return self.dispatching("")

    def taken(self, worker_id: str) -> str:
        """The ids reclaim.lua took back from a worker on this stream (a set, with a TTL): its lease pass tells
        them from entries it settled meanwhile (recovery.py). Per band, like ``running``."""
        return f"{self.prefix}taken-{self.band}:{worker_id}" if self.band else f"{self.prefix}taken:{worker_id}"

    @property
    def taken_prefix(self) -> str:
        """``taken(worker)`` without the worker: the prefix reclaim.lua adds an owner's id to."""
        return self.taken("")

    def died(self, worker_id: str) -> str:
        """A worker's death record on this queue: written by whoever saw its process end (its supervisor);
        reclaim.lua charges its lost runs as deaths only when it is there."""
        return f"{self.prefix}died:{worker_id}"


QUEUES_REGISTRY = "chasqui:queues"
"""A set of every queue name ever used, so operators can list queues without SCAN."""

WORKER_CONTROL_PREFIX = "chasqui:control:"
"""``<prefix><worker id>``: the command an operator left for one worker (control.py). Outside any queue's tag,
since a worker serves several queues."""


def worker_control(worker_id: str) -> str:
    return WORKER_CONTROL_PREFIX + worker_id


SCHEDULES_PREFIX = "{chasqui:schedules}:"
"""Every schedule key shares one hash tag, so the scheduler's scripts touch one Redis Cluster slot."""
SCHEDULER_LOCK = SCHEDULES_PREFIX + "lock"
"""The scheduler's leader lock: the one process that fires schedules holds it (SET NX PX, renewed)."""


def schedule_state(name: str) -> str:
    """A hash of one schedule's state: next due time, the definition it was computed for, last fire, pause."""
    return f"{SCHEDULES_PREFIX}state:{name}"


def schedule_fires(name: str) -> str:
    """A list of one schedule's recent fires, newest first (see scheduler.py for a record's fields)."""
    return f"{SCHEDULES_PREFIX}fires:{name}"
