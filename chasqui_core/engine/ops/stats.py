"""What operators see of their queues, and the few switches they may flip.

The ops API, the CLI and the console all read queue health from here. The
console samples every queue once a second, so each read is one pipelined
round trip for all the queues asked about, and "now" is the server's clock
read inside that round trip: delayed-job scores and overdue ages are measured
against the clock that wrote them, never against the caller's.

A queue that no worker has served yet has no consumer group, and a queue that
was never written to has no keys at all; both read as zeros, never as errors.

A queue with priority bands (priority.py) has a stream per band: its depth,
pending and lag figures are the sums over them. Which bands a queue has is
read with its other figures (its ``bands`` set); only the queues that have
any cost one more round trip, shared by all of them (``add_bands``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from chasqui_core.engine.store.connection import Client, is_cluster_client
from chasqui_core.engine.jobs.errors import InvalidQueueName
from chasqui_core.engine.store.keys import BANDS, GROUP, QUEUES_REGISTRY, QueueKeys, validate_queue_name
from chasqui_core.engine.jobs.priority import band_label
from chasqui_core.engine.store.scripts import source

DEFAULT_STALE_AFTER_MS = 10_000
"""A worker whose heartbeat is older than this is counted as gone (workers beat every 2 s)."""


@dataclass(frozen=True, slots=True)
class QueueStats:
    name: str
    stream_length: int
    """Entries in the stream: waiting ones plus delivered ones not settled yet."""
    pending: int
    """Entries delivered to a worker and not settled yet (the consumer group's pending list)."""
    in_flight: int
    """Jobs running, as last reported by the live workers of this queue.

    A worker reports one figure for all its queues, so a worker serving several
    queues adds its whole count to each of them.
    """
    delayed: int
    overdue: int
    """Delayed jobs whose run-at time has passed but that the promoter has not moved yet."""
    oldest_overdue_age_ms: int
    """How late the most overdue delayed job is; 0 when none is overdue."""
    dlq: int
    paused: bool
    workers: int
    """Workers with a fresh heartbeat on this queue."""
    lag: int | None
    """Entries the consumer group has not read yet, when the server can tell (Redis 7+)."""
    band_streams: tuple[str, ...] = ()
    """The priority bands ("high", "low") the queue has a stream of besides its own; () without priorities."""
    bands: dict[str, int] = dataclasses.field(default_factory=dict)
    """Jobs waiting (not yet handed to a worker) per band, "high", "default", "low", highest first, when the
    queue has band streams (``add_bands`` reads them); empty for a queue without priorities."""

    @property
    def waiting(self) -> int:
        """Jobs in the stream(s) not handed to a worker yet: the lag when the server knows it for every stream."""
        return waiting_of(self.stream_length, self.pending, self.lag)


@dataclass(frozen=True, slots=True)
class CurrentJob:
    """A job a worker was running at its last heartbeat."""

    task: str
    job_id: str
    started_at_ms: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    processed: int
    failed: int
    started_at_ms: int
    last_seen_ms: int
    stale: bool
    """The heartbeat is older than the staleness bound: the worker stopped or cannot reach Redis."""
    problem: str = ""
    """What the worker reports wrong with itself (a slot that died and was restarted...); "" when healthy."""
    memory_kb: int = 0
    """Resident memory of the worker process at its last heartbeat (0 when unknown)."""
    current: tuple[CurrentJob, ...] = ()
    """Its longest-running jobs at the last heartbeat, oldest first (at most 20)."""
    supervisor_pid: int | None = None
    """The pid of the ``runworker --processes`` supervisor this worker runs under; None when it runs alone."""
    state: str = "running"
    """``running``, ``quiet`` (takes no more jobs) or ``stopping``: see control.py."""


# --- queues -----------------------------------------------------------------


def _valid(name: str) -> bool:
    try:
        validate_queue_name(name)
    except InvalidQueueName:
        return False
    return True


def list_queues(client: Client) -> list[str]:
    """Every registered queue, sorted.

    Names that could not be a queue (written to the registry by something
    other than Chasqui) are left out rather than breaking every caller.
    """
    names = (m.decode() if isinstance(m, bytes) else m for m in client.smembers(QUEUES_REGISTRY))
    return sorted(n for n in names if _valid(n))


def queue_exists(client: Client, name: str) -> bool:
    """True when the queue is registered or its stream exists."""
    keys = QueueKeys.for_queue(name)
    pipe = client.pipeline(transaction=False)
    pipe.sismember(QUEUES_REGISTRY, name)
    pipe.exists(keys.stream)
    registered, exists = pipe.execute()
    return bool(registered) or bool(exists)


def _group_info(reply: Any) -> tuple[int, int | None]:
    """(pending, lag) of the Chasqui group from an XINFO GROUPS reply; zeros when there is none."""
    if isinstance(reply, ResponseError):
        if "no such key" in str(reply).lower():  # nothing was ever added to the queue
            return 0, None
        raise reply
    for group in reply:
        name = group.get("name")
        if isinstance(name, bytes):
            name = name.decode()
        if name == GROUP:
            lag = group.get("lag")
            return int(group.get("pending") or 0), (int(lag) if lag is not None else None)
    return 0, None


def waiting_of(length: int, pending: int, lag: int | None) -> int:
    """A stream's entries not handed to a worker: its group's lag when the server knows it, else the stream's
    length less the entries pending (after deletions the server may not know the lag)."""
    return lag if lag is not None else max(0, length - pending)


def add_stream_reads(pipe: Client, stream: str) -> None:
    """Queue the two reads behind ``stream_figures`` on ``pipe``: XLEN and XINFO GROUPS."""
    pipe.xlen(stream)
    pipe.xinfo_groups(stream)


def stream_figures(length: Any, groups: Any) -> tuple[int, int, int | None]:
    """(length, pending, lag) of one stream from the replies of ``add_stream_reads`` (zeros when it is absent)."""
    if isinstance(length, Exception):
        raise length
    pending, lag = _group_info(groups)
    return int(length), pending, lag


def band_names(reply: Any) -> tuple[str, ...]:
    """The bands named by an SMEMBERS reply of a queue's ``bands`` set, highest first; unknown names left out."""
    names = {m.decode() if isinstance(m, bytes) else str(m) for m in reply or ()}
    return tuple(b for b in BANDS if b and b in names)


def _raise_errors(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


STATS_READS = 7
"""Commands ``add_stats_reads`` queues per queue."""


def add_stats_reads(pipe: Client, keys: QueueKeys) -> None:
    """Queue the STATS_READS commands behind one queue's QueueStats on ``pipe``.

    Lets a caller that reads more than stats (the Prometheus collector) keep
    everything in one round trip; ``stats_from_replies`` turns the replies
    (read with ``raise_on_error=False``) into QueueStats, and ``add_bands``
    adds the figures of the queues' priority bands.
    """
    add_stream_reads(pipe, keys.stream)
    pipe.execute_command("EVAL", source("delayed_stats"), 1, keys.delayed)
    pipe.xlen(keys.dlq)
    pipe.exists(keys.paused)
    pipe.hgetall(keys.workers)
    pipe.smembers(keys.bands)


def add_clock_read(pipe: Client, key: str) -> None:
    """Queue a read of the server's clock on ``pipe``; ``server_ms`` turns its reply into epoch ms.

    TIME on a plain pipeline; on a cluster's, where a command needs a key to
    find its node, ``clock.lua`` on the node that serves ``key``.
    """
    if is_cluster_client(pipe):
        pipe.execute_command("EVAL", source("clock"), 1, key)
    else:
        pipe.time()


def server_ms(time_reply: Any) -> int:
    """Epoch ms from a TIME reply (or clock.lua's)."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def stats_from_replies(keys: QueueKeys, replies: list[Any], now_ms: int,
                       stale_after_ms: int = DEFAULT_STALE_AFTER_MS) -> QueueStats:
    """A queue's QueueStats from the replies of ``add_stats_reads``; ``now_ms`` is the server's clock.

    Its stream figures are the default band's: for a queue with other bands
    (``band_streams``), ``add_bands`` sums theirs in.
    """
    length, groups, delayed, dlq, paused, beats, bands = replies
    _raise_errors([delayed, dlq, paused, beats, bands])
    length, pending, lag = stream_figures(length, groups)
    script_now, size, overdue, lowest = (int(x) for x in delayed)
    live = live_workers(beats, now_ms, stale_after_ms)
    return QueueStats(
        name=keys.queue,
        stream_length=int(length),
        pending=pending,
        in_flight=sum(w.in_flight for w in live),
        delayed=size,
        overdue=overdue,
        oldest_overdue_age_ms=max(0, script_now - lowest) if overdue else 0,
        dlq=int(dlq),
        paused=bool(paused),
        workers=len(live),
        lag=lag,
        band_streams=band_names(bands),
    )


def add_bands(client: Client, queues: list[QueueStats]) -> list[QueueStats]:
    """``queues`` with the figures of their priority bands' streams summed in, in one round trip for all.

    A queue without band streams is returned as it is; when none has any,
    nothing is read.
    """
    banded = [(i, QueueKeys.for_queue(s.name), s.band_streams) for i, s in enumerate(queues) if s.band_streams]
    if not banded:
        return queues
    pipe = client.pipeline(transaction=False)
    for _, keys, bands in banded:
        for band in bands:
            add_stream_reads(pipe, keys.in_band(band).stream)
    replies = iter(pipe.execute(raise_on_error=False))
    out = list(queues)
    for i, _keys, bands in banded:
        s = queues[i]
        length, pending, lag = s.stream_length, s.pending, s.lag
        waiting = {"": waiting_of(length, pending, lag)}
        for band in bands:
            n, p, g = stream_figures(next(replies), next(replies))
            waiting[band] = waiting_of(n, p, g)
            length += n
            pending += p
            lag = None if lag is None or g is None else lag + g
        out[i] = replace(s, stream_length=length, pending=pending, lag=lag,
                         bands={band_label(b): waiting[b] for b in BANDS if b in waiting})
    return out


def all_queue_stats(
    client: Client, names: list[str] | None = None, *, stale_after_ms: int = DEFAULT_STALE_AFTER_MS
) -> list[QueueStats]:
    """Stats of the given queues (default: every registered queue), in one round trip.

    Listing the registry, when no names are given, costs one more round trip;
    so does reading the priority bands, when any of the queues has some.
    """
    if names is None:
        names = list_queues(client)
    all_keys = [QueueKeys.for_queue(n) for n in names]
    if not all_keys:
        return []
    pipe = client.pipeline(transaction=False)
    add_clock_read(pipe, QUEUES_REGISTRY)
    for k in all_keys:
        add_stats_reads(pipe, k)
    replies = pipe.execute(raise_on_error=False)
    now = server_ms(replies[0])
    n = STATS_READS
    return add_bands(client, [stats_from_replies(k, replies[1 + n * i: 1 + n * (i + 1)], now, stale_after_ms)
                              for i, k in enumerate(all_keys)])


def queue_stats(client: Client, name: str, *, stale_after_ms: int = DEFAULT_STALE_AFTER_MS) -> QueueStats:
    return all_queue_stats(client, [name], stale_after_ms=stale_after_ms)[0]


# --- pause / resume -----------------------------------------------------------


def pause(client: Client, name: str) -> bool:
    """Stop workers from reading the queue (within one heartbeat); False when it was paused already.

    Jobs already fetched still run; producers can still add jobs.
    """
    return bool(client.set(QueueKeys.for_queue(name).paused, b"1", nx=True))


def resume(client: Client, name: str) -> bool:
    """Let workers read the queue again; False when it was not paused."""
    return bool(client.delete(QueueKeys.for_queue(name).paused))


# --- workers ------------------------------------------------------------------


def _decode_worker(raw: bytes, now: int, stale_after_ms: int) -> WorkerInfo | None:
    try:
        info = msgpack.unpackb(raw, raw=False)
        last_seen = int(info["last_seen"])
        return WorkerInfo(
            id=str(info["id"]),
            host=str(info.get("host", "")),
            pid=int(info.get("pid", 0)),
            queues=[str(q) for q in info.get("queues", [])],
            concurrency=int(info.get("concurrency", 0)),
            in_flight=int(info.get("in_flight", 0)),
            processed=int(info.get("processed", 0)),
            failed=int(info.get("failed", 0)),
            started_at_ms=int(info.get("started_at", 0)),
            last_seen_ms=last_seen,
            stale=now - last_seen > stale_after_ms,
            problem=str(info.get("problem") or ""),
            memory_kb=int(info.get("rss_kb") or 0),
            current=tuple(CurrentJob(str(task), str(job_id), int(started))
                          for task, job_id, started in info.get("current") or ()),
            supervisor_pid=int(info["supervisor"]) if info.get("supervisor") else None,
            state=str(info.get("state") or "running"),
        )
    except Exception:  # a heartbeat not written by a Chasqui worker
        return None


def _decode_workers(beats: dict[bytes, bytes], now: int, stale_after_ms: int) -> list[WorkerInfo]:
    out = []
    for raw in beats.values():
        info = _decode_worker(raw, now, stale_after_ms)
        if info is not None:
            out.append(info)
    return out


def live_workers(beats: dict[bytes, bytes], now_ms: int,
                 stale_after_ms: int = DEFAULT_STALE_AFTER_MS) -> list[WorkerInfo]:
    """The workers of one queue's heartbeat hash (HGETALL reply) whose heartbeat is fresh at ``now_ms``."""
    return [w for w in _decode_workers(beats, now_ms, stale_after_ms) if not w.stale]


def _heartbeats(client: Client, queue: str | None) -> tuple[int, list[tuple[QueueKeys, dict[bytes, bytes]]]]:
    """Server ms and every queue's raw heartbeat hash, in one round trip after the registry."""
    names = [queue] if queue is not None else list_queues(client)
    all_keys = [QueueKeys.for_queue(n) for n in names]
    pipe = client.pipeline(transaction=False)
    add_clock_read(pipe, QUEUES_REGISTRY)
    for k in all_keys:
        pipe.hgetall(k.workers)
    replies = pipe.execute()
    return server_ms(replies[0]), list(zip(all_keys, replies[1:], strict=False))


def workers(client: Client, queue: str | None = None, *,
            stale_after_ms: int = DEFAULT_STALE_AFTER_MS) -> list[WorkerInfo]:
    """Workers known from their heartbeats, on one queue or on all, sorted by id.

    A worker serving several queues beats on each; it is listed once, with its
    freshest heartbeat. Staleness is judged by the server's clock, the one
    reference every host shares.
    """
    now, hashes = _heartbeats(client, queue)
    seen: dict[str, WorkerInfo] = {}
    for _keys, beats in hashes:
        for info in _decode_workers(beats, now, stale_after_ms):
            known = seen.get(info.id)
            if known is None or info.last_seen_ms > known.last_seen_ms:
                seen[info.id] = info
    return [seen[i] for i in sorted(seen)]


def prune_stale_workers(client: Client, *, stale_after_ms: int = 60_000) -> int:
    """Remove heartbeats older than ``stale_after_ms`` (and unreadable ones); returns how many.

    Workers that stop cleanly remove their own heartbeat; this clears those
    that were killed. A worker wrongly pruned in the instant it beats again
    reappears at its next heartbeat.
    """
    now, hashes = _heartbeats(client, None)
    pipe = client.pipeline(transaction=False)
    for keys, beats in hashes:
        gone = []
        for field, raw in beats.items():
            info = _decode_worker(raw, now, stale_after_ms)
            if info is None or info.stale:
                gone.append(field)
        if gone:
            pipe.hdel(keys.workers, *gone)
    if not len(pipe):
        return 0
    return sum(pipe.execute())
