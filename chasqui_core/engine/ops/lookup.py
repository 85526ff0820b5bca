"""Find one job by its id, in whatever state it is: waiting, running, delayed, dead or finished.

Redis keeps no index from a job id to where the job is (but for dead jobs:
the DLQ's index, and for delayed jobs: their marks), and the scripts that
move jobs about are the worker's, so this module searches, cheapest places
first, and stops where it finds the job:

1. One pipelined round trip over every queue: the workers' heartbeats (each
   lists the jobs it runs), the ``result:<id>`` record (when result storage
   is on), the ``unique:<id>`` marker of caller-given ids (it names the
   stream entry the job was added at, which is read next, after the DLQ's
   index) and the ``djob:<id>`` mark of a delayed job, and the queue's
   priority bands. A result or a marker names the job's queue, and the rest
   of the search keeps to it.
2. The delayed set at the score the job's mark holds (``delayed.by_mark``):
   every script that adds to the set writes the mark with it, and it is not
   removed when the job leaves, so the members of that score are read to
   check it (one call, even when a million share it). A delayed job
   is found here; a mark the set does not bear out means the job left it,
   and the set is not scanned for it.
3. The stream, near the job's creation: a job id that is a ULID starts with
   the millisecond it was made, and a job added at once got a stream id of
   about that millisecond (server clock). Entries are read outwards from
   there, forwards and backwards at once, ``CHUNK`` at a time. A job whose
   mark was stale (it left the delayed set, promoted when due) is looked for
   the same way around its due time, the mark's score.
4. The delayed set of a queue holding no mark of the job (a job delayed
   before marks were written has none): members are envelopes holding the id
   verbatim, so ``ZSCAN MATCH *<id>*`` filters on the server (about 0.7 µs a
   member).
5. The dead-letter stream. Its index (``dlq/index.py``) maps job ids to
   entries; it is read in the first round trip, and a job it names (and no
   worker runs, and no mark shows in the delayed set) is returned as dead
   before any stream or set is scanned: one more round trip. When the index is ready and does not name
   the job, the DLQ is not scanned. Otherwise (an index being rebuilt): its entries carry a
   ``job_id`` field. A job dies
   after it is made, so for a ULID nothing older than its creation (less
   ``CLOCK_SKEW_MS``) is read; the rest is read from both ends at once, from
   just before its creation forwards and from the newest backwards, since a
   job dies either soon after it was made or not long ago.
6. The rest of the stream (a job promoted from the delayed set, retried,
   replayed or put back gets a later entry), from both ends.

Every scan stops after ``scan_limit`` entries per place; the answer says what
was read, so a miss after a cut-short scan is reported as such, never as
"does not exist". ``wide=False`` (the console's first look) stops after the
places the id leads to (1-3, and 5 when the index is ready): an unknown id is
answered in milliseconds whatever the queues hold, and the answer says what
it left unread (4, 6, and 5 while the index is rebuilt) unless those were
empty, so a person can ask for the rest. Reading a stream costs about 2 µs an entry on the client
(a Lua scan on the server measured slower, and would block it meanwhile).
"The stream" is each of the queue's streams in turn, its own first, then its
priority bands' (priority.py): the same search, per stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import msgpack
from redis.exceptions import ResponseError

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.timing.delayed import _glob_escape, by_mark
from chasqui_core.engine.dlq.entries import DeadJob, decode_entry
from chasqui_core.engine.dlq.shared import resolve
from chasqui_core.engine.dlq.index import DLQIndex, IndexKeys
from chasqui_core.engine.jobs.envelope import DecodeError, Job, decode
from chasqui_core.engine.store.keys import BANDS, GROUP, QueueKeys
from chasqui_core.engine.jobs.progress import Progress
from chasqui_core.engine.jobs.progress import decode as decode_progress
from chasqui_core.engine.jobs.results import decode_result
from chasqui_core.engine.ops.stats import _decode_worker, add_clock_read, server_ms
from chasqui_core.engine.ops.stream_scan import NEAR as NEAR  # re-exported: how far the first look reads
from chasqui_core.engine.ops.stream_scan import (Search, match_stream, packed_id, stream_name, stream_near, stream_wide,
                                                 wide)

State = Literal["waiting", "running", "delayed", "dead", "finished"]


ZSCAN_COUNT = 10_000
"""Members the server checks per ZSCAN call (about 10 ms at most of its time)."""

_CROCKFORD = {c: i for i, c in enumerate("0123456789ABCDEFGHJKMNPQRSTVWXYZ")}
_FINISHED = ("SUCCESSFUL", "FAILED")


def ulid_ms(job_id: str) -> int | None:
    """The creation time (epoch ms) in a ULID job id; None for any other id."""
    if len(job_id) != 26:
        return None
    ms = 0
    for ch in job_id.upper():
        value = _CROCKFORD.get(ch)
        if value is None:
            return None
        ms = ms * 32 + value
    ms >>= 80
    return ms if ms < 2**48 else None


@dataclass(frozen=True, slots=True)
class Running:
    """A worker that was running the job at its last heartbeat."""

    worker: str
    started_at_ms: int
    stale: bool


@dataclass(frozen=True, slots=True)
class JobLookup:
    """Where a job is, and what was read to find out.

    ``state`` is None when the job was found nowhere; ``complete`` then says
    whether every place was read to its end (a definite "not there") or a
    scan was cut short at ``scan_limit``.
    """

    job_id: str
    state: State | None
    queue: str | None = None
    job: Job | None = None
    """The envelope, when the job was found in a stream, the delayed set or the DLQ."""
    stream_entry: str | None = None
    delivered_to: str | None = None
    """The consumer (worker) holding the stream entry, when it was delivered and not settled yet."""
    deliveries: int = 0
    running: Running | None = None
    run_at_ms: int | None = None
    """When a delayed job is due (server clock)."""
    dead: DeadJob | None = None
    result: dict[str, Any] | None = None
    """The stored outcome record (results.py), when result storage keeps one."""
    created_ms: int | None = None
    """The creation time read from a ULID id (producer clock)."""
    scanned: int = 0
    """Entries and members read in all."""
    complete: bool = True
    searched: tuple[str, ...] = ()
    """What was read, in words, place by place."""
    narrowed: bool = False
    """The lookup left out the wide scans (``wide=False``) and they had entries to read: ``complete`` is then
    False, and a wide lookup may still find the job."""
    cancel_requested_ms: int | None = None
    """When a cancel of the job was asked for, while the request is on record (cancel.py; see ``watching``)."""
    progress: Progress | None = None
    """The latest progress the job reported (progress.py; see ``watching``)."""

    @property
    def found(self) -> bool:
        return self.state is not None


def find_job(client: Client, job_id: str, queues: Sequence[str], *, scan_limit: int = 200_000,
             zscan_limit: int = 1_000_000, wide: bool = True) -> JobLookup:
    """Look for ``job_id`` in every one of ``queues``; see the module's docstring for the order.

    ``scan_limit`` bounds the entries read in each stream and DLQ of each
    queue searched; ``zscan_limit`` the members checked in each delayed set,
    which the server matches itself, about three times as fast as a stream is
    read. ``wide=False`` reads only where the id leads (marks, records, the
    DLQ's index, the stream near a ULID's time, the entry a caller-given
    id's marker names) and says what it left.
    """
    if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
        raise ValueError("job_id must be a non-empty string of at most 200 characters")
    if isinstance(scan_limit, bool) or not isinstance(scan_limit, int) or scan_limit < 1:
        raise ValueError(f"scan_limit must be a whole number of 1 or more, got {scan_limit!r}")
    if isinstance(zscan_limit, bool) or not isinstance(zscan_limit, int) or zscan_limit < 1:
        raise ValueError(f"zscan_limit must be a whole number of 1 or more, got {zscan_limit!r}")
    search = Search(client, job_id, scan_limit, zscan_limit, ulid_ms(job_id))
    all_keys = [QueueKeys.for_queue(q) for q in queues]
    if not all_keys:
        return _done(search, None, JobLookup(job_id, None))

    # 1. heartbeats, result records, unique markers: one round trip
    pipe = client.pipeline(transaction=False)
    add_clock_read(pipe, all_keys[0].workers)
    for k in all_keys:
        pipe.hgetall(k.workers)
        pipe.get(k.result + job_id)
        pipe.get(k.unique + job_id)
        pipe.hget(IndexKeys.for_queue(k).jobs, job_id)
        pipe.get(k.delayed_mark(job_id))
        pipe.smembers(k.bands)
        pipe.get(k.replay_mark(job_id))
    replies = pipe.execute()
    now = server_ms(replies[0])
    running: dict[str, Running] = {}
    results: dict[str, dict[str, Any]] = {}
    marked: list[str] = []
    indexed: dict[str, bytes] = {}
    marks: dict[str, bytes] = {}
    replayed: dict[str, bytes] = {}
    added_at: dict[str, bytes] = {}
    """Queue -> "<band> <entry id>": where a caller-given id's job was added (its marker, enqueue.lua)."""
    streams: dict[str, list[QueueKeys]] = {}
    """Each queue's streams, its own first, then its priority bands' (high, low)."""
    for i, k in enumerate(all_keys):
        beats, blob, unique, dead_entry, mark, bands, replayed_to = replies[1 + 7 * i: 8 + 7 * i]
        if replayed_to is not None:
            replayed[k.queue] = replayed_to
        streams[k.queue] = sorted(k.band_keys(b.decode() if isinstance(b, bytes) else b for b in bands),
                                  key=lambda band: band.band != "")
        if dead_entry is not None:
            indexed[k.queue] = dead_entry
        if mark is not None:
            marks[k.queue] = mark
        for raw in beats.values():
            info = _decode_worker(raw, now, 10_000)
            if info is None:
                continue
            for cur in info.current:
                if cur.job_id == job_id and (k.queue not in running or not info.stale):
                    running[k.queue] = Running(info.id, cur.started_at_ms, info.stale)
        if blob is not None:
            with contextlib.suppress(ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
                results[k.queue] = decode_result(blob)  # a record not written by Chasqui is no result
        if unique is not None:
            marked.append(k.queue)
            if b" " in unique:
                added_at[k.queue] = unique
    search.note(f"heartbeats, result records, id markers and delayed marks of {_queues(all_keys)}")
    owners = list(dict.fromkeys([*running, *results, *marked]))
    if owners:  # the job is known to belong there: search no other queue
        all_keys = [k for k in all_keys if k.queue in owners]

    finished = next(((q, r) for q, r in results.items() if r.get("status") in _FINISHED), None)
    if finished is not None and finished[1].get("status") == "SUCCESSFUL" and not running:
        return _done(search, finished[1], JobLookup(job_id, "finished", queue=finished[0]))

    # 2. the delayed set at the score a mark names
    unmarked = []
    left_set: dict[str, int] = {}
    """Queues whose delayed set the job left: its due time, about when its promotion gave it a stream entry."""
    for k in all_keys:
        if k.queue not in marks:
            unmarked.append(k)
            continue
        at_mark = by_mark(client, k, job_id, marks[k.queue])
        if at_mark is None:  # cannot tell: the set is scanned in its turn
            unmarked.append(k)
        elif at_mark is not False:
            _, job, score = at_mark
            search.note(f"the delayed set of {k.queue} at the job's mark: found")
            return _done(search, results.get(k.queue), JobLookup(job_id, "delayed", queue=k.queue,
                                                                 job=job, run_at_ms=int(score)))
        else:
            search.note(f"the delayed set of {k.queue} at the job's mark: not there (it left the set)")
            left_set[k.queue] = int(float(marks[k.queue]))

    # the DLQ's index names the job's entry (read in the first round trip): no stream, delayed set or DLQ is scanned
    if not running:
        for k in all_keys:
            if k.queue in indexed:
                at_entry = _dead_at(search, k, indexed[k.queue])
                if at_entry is not None:
                    return _done(search, results.get(k.queue), at_entry)

    # the stream entry a replay gave the job, or the one it was added at (a caller-given id's marker), when its
    # mark is there: checked, not trusted
    for k in all_keys:
        for marks_of, what in ((replayed, "its replay gave it"), (added_at, "it was added at")):
            if k.queue in marks_of:
                band_name, _, entry = marks_of[k.queue].decode(errors="replace").partition(" ")
                if band_name not in BANDS:
                    continue
                where = k.in_band(band_name)
                try:
                    rows = client.xrange(where.stream, entry, entry, count=1) if entry else []
                except ResponseError:  # not an entry id: a mark no Chasqui script wrote
                    rows = []
                hit = match_stream(search, rows)
                if hit is not None:
                    search.note(f"the stream of {stream_name(where)} at the entry {what}: found")
                    return _done(search, results.get(k.queue), _in_stream(search, where, *hit, running.get(k.queue)))
                search.note(f"the stream of {stream_name(where)} at the entry {what}: gone (it ran since)")

    # 3. the stream near the job's creation
    if search.created_ms is not None:
        for k in all_keys:
            for band in streams[k.queue]:
                hit = stream_near(search, band, search.created_ms)
                if hit is not None:
                    return _done(search, results.get(k.queue), _in_stream(search, band, *hit, running.get(k.queue)))

    # the stream near the due time of a job that left the delayed set (promoted when due: a retry, a delayed job)
    for k in all_keys:
        if k.queue in left_set:
            for band in streams[k.queue]:
                hit = stream_near(search, band, left_set[k.queue], "its due time")
                if hit is not None:
                    return _done(search, results.get(k.queue), _in_stream(search, band, *hit, running.get(k.queue)))

    if not wide:
        if not running:  # a DLQ whose index is not ready: moved on a moment, as any read does, else read
            for k in all_keys:
                dlq_index = DLQIndex(client, k.queue)
                if dlq_index.state().ready:
                    continue
                if dlq_index.advance().ready:
                    eid = dlq_index.find_job(job_id)
                    at_entry = _dead_at(search, k, eid.encode()) if eid is not None else None
                else:
                    dead = _dead(search, k)
                    at_entry = JobLookup(job_id, "dead", queue=k.queue, job=dead.job, dead=dead) if dead else None
                if at_entry is not None:
                    return _done(search, results.get(k.queue), at_entry)
        queue = next(iter(running), None)
        found = _narrowed(search, all_keys, unmarked, streams, queue, running.get(queue) if queue else None)
        if found.state is None and finished is not None:
            return _done(search, finished[1], JobLookup(job_id, "finished", queue=finished[0]))
        owner = queue or (owners[0] if owners else None)
        return _done(search, results.get(owner) if owner else None, replace(found, queue=owner))

    # 4. the delayed sets holding no mark of the job
    for k in unmarked:
        delayed = _delayed(search, k)
        if delayed is not None:
            job, score = delayed
            return _done(search, results.get(k.queue), JobLookup(job_id, "delayed", queue=k.queue, job=job,
                                                                 run_at_ms=score))

    # a job a worker runs but whose entry was not near its creation: say so before the wider scans
    if running:
        queue, run = next(iter(running.items()))
        for band in streams[queue]:
            hit = stream_wide(search, band)
            if hit is not None:
                return _done(search, results.get(queue), _in_stream(search, band, *hit, run))
        return _done(search, results.get(queue), JobLookup(job_id, "running", queue=queue, running=run))

    # 5. the dead-letter queue
    for k in all_keys:
        dead = _dead(search, k)
        if dead is not None:
            return _done(search, results.get(k.queue), JobLookup(job_id, "dead", queue=k.queue, job=dead.job,
                                                                 dead=dead))
    if finished is not None:
        return _done(search, finished[1], JobLookup(job_id, "finished", queue=finished[0]))

    # 6. the rest of the stream
    for k in all_keys:
        for band in streams[k.queue]:
            hit = stream_wide(search, band)
            if hit is not None:
                return _done(search, results.get(k.queue), _in_stream(search, band, *hit, None))
    owner = owners[0] if owners else None
    return _done(search, results.get(owner) if owner else None, JobLookup(job_id, None, queue=owner))


def _done(search: Search, result: dict[str, Any] | None, found: JobLookup) -> JobLookup:
    return JobLookup(
        found.job_id, found.state, found.queue, found.job, found.stream_entry, found.delivered_to,
        found.deliveries, found.running, found.run_at_ms, found.dead, result, search.created_ms, search.scanned,
        search.complete, tuple(search.notes), search.narrowed,
    )


def _narrowed(search: Search, keys: Sequence[QueueKeys], unmarked: Sequence[QueueKeys],
              streams: dict[str, list[QueueKeys]], queue: str | None, run: Running | None) -> JobLookup:
    """The answer of a lookup that read only where the id leads: running (a worker says so), or not found, with
    what the wide scans would have read (one round trip), so an empty queue still gets a definite answer."""
    pipe = search.client.pipeline(transaction=False)
    for k in unmarked:
        pipe.zcard(k.delayed)
    bands = [band for k in keys for band in streams[k.queue]]
    for band in bands:
        pipe.xlen(band.stream)
    indexes = [DLQIndex(search.client, k.queue) for k in keys]
    for index in indexes:
        index.add_state_reads(pipe)
    replies = pipe.execute()
    sizes = iter(replies)
    left = []
    for k in unmarked:
        members = int(next(sizes))
        if members:
            left.append(f"the delayed set of {k.queue} ({members:,} members)")
        else:
            search.note(f"the delayed set of {k.queue}: empty")
    left += [f"the rest of the stream of {stream_name(b)} ({n:,} entries)" for b in bands
             if (n := int(next(sizes)) - search.near.get(b.stream, 0)) > 0]
    at = len(unmarked) + len(bands)
    for i, index in enumerate(indexes):
        state = DLQIndex.parse_state(replies[at + 3 * i: at + 3 * i + 3])
        if state.ready:
            search.note(f"the dead-letter index of {index.queue}: not there")
        elif state.length:
            left.append(f"the dead-letter queue of {index.queue} ({state.length:,} entries, its index being rebuilt)")
    if left:
        search.narrowed = True
        search.complete = False
        search.note("not read: " + "; ".join(left))
    if run is not None and queue is not None:
        return JobLookup(search.job_id, "running", queue=queue, running=run)
    return JobLookup(search.job_id, None, queue=queue)


def _dead_at(search: Search, k: QueueKeys, eid: bytes) -> JobLookup | None:
    """The dead job at the DLQ entry its index names, or None when that entry is gone."""
    rows = search.client.xrange(k.dlq, eid, eid, count=1)
    if not rows:
        return None
    entry = decode_entry(k.queue, *rows[0])
    resolve(search.client, k.dlq, [entry])
    search.note(f"the dead-letter index of {k.queue}: found")
    return JobLookup(search.job_id, "dead", queue=k.queue, job=entry.job, dead=entry)


def _queues(keys: Sequence[QueueKeys]) -> str:
    names = [k.queue for k in keys]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"queue{'s' if len(names) != 1 else ''} {shown}"


def _in_stream(search: Search, k: QueueKeys, eid: bytes, job: Job, run: Running | None) -> JobLookup:
    """A stream hit is waiting, or running when the consumer group delivered it and has not settled it."""
    entry = eid.decode()
    consumer, deliveries = None, 0
    try:
        pending = search.client.xpending_range(k.stream, GROUP, min=entry, max=entry, count=1)
    except Exception:  # no consumer group yet: nothing was ever delivered  # noqa: BLE001
        pending = []
    if pending:
        name = pending[0]["consumer"]
        consumer = name.decode() if isinstance(name, bytes) else str(name)
        deliveries = int(pending[0]["times_delivered"])
    state: State = "running" if consumer is not None or run is not None else "waiting"
    return JobLookup(search.job_id, state, queue=k.queue, job=job, stream_entry=entry, delivered_to=consumer,
                     deliveries=deliveries, running=run)


def _delayed(search: Search, k: QueueKeys) -> tuple[Job, int] | None:
    pattern = b"*" + _glob_escape(search.job_id) + b"*"
    cursor, read = 0, 0
    size = int(search.client.zcard(k.delayed))
    while True:
        cursor, rows = search.client.zscan(k.delayed, cursor, match=pattern, count=ZSCAN_COUNT)
        read += ZSCAN_COUNT
        for member, score in rows:
            try:
                job = decode(member)
            except DecodeError:
                continue
            if job.id == search.job_id:
                search.scanned += min(read, size)
                search.note(f"the delayed set of {k.queue}: found")
                return job, int(score)
        if cursor == 0:
            break
        if read >= search.zscan_limit:
            search.complete = False
            break
    search.scanned += min(read, size)
    search.note(f"the delayed set of {k.queue}: {min(read, size):,} of {size:,} members"
                + ("" if cursor == 0 else f" (stopped at the limit of {search.zscan_limit:,})"))
    return None


def _dead(search: Search, k: QueueKeys) -> DeadJob | None:
    if DLQIndex(search.client, k.queue).state().ready:  # it would have named the entry
        search.note(f"the dead-letter index of {k.queue}: not there")
        return None
    wanted = search.job_id.encode()
    before = search.scanned
    for rows in wide(search, k.dlq):
        for eid, fields in rows:
            stored = fields.get(b"job_id")
            if stored == wanted or (not stored and packed_id(search.job_id) in fields.get(b"j", b"")):
                dead = decode_entry(k.queue, eid, fields)
                if dead.job_id == search.job_id:
                    resolve(search.client, k.dlq, [dead])
                    search.note(f"the dead-letter queue of {k.queue}: found")
                    return dead
    since = " made since the job was" if search.created_ms is not None else ""
    search.complete = search.complete and not search.cut_short
    search.note(f"the dead-letter queue of {k.queue}: {search.scanned - before:,} entries{since}"
                + (f" (stopped at the limit of {search.scan_limit:,})" if search.cut_short else ""))
    return None


def watching(client: Client, found: JobLookup) -> JobLookup:
    """The lookup with what people watching a job want besides its state: the progress it reported and
    whether a cancel is pending. One round trip; for a job found in a queue."""
    if found.queue is None:
        return found
    keys = QueueKeys.for_queue(found.queue)
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.cancel, found.job_id)
    pipe.get(keys.progress + found.job_id)
    asked, reported = pipe.execute()
    return replace(found, cancel_requested_ms=int(asked) if asked is not None else None,
                   progress=decode_progress(reported))
