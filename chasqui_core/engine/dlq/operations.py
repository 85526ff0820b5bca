"""Replays and discards by filter that run in worker processes, not in the process that asked for them.

A request (console, API, CLI) only records an operation: a hash
``{chasqui:<q>}:op:<id>`` with its definition and progress, and its id in the
queue's set of unfinished operations. Every worker of the queue looks at that
set (``OperationsLoop``, one more long-lived part of the worker) and one of
them claims the operation (``op_claim.lua``) and sweeps the entries it
matches, oldest first, one chunk per call (``selection.chunks``: through the
DLQ's index for a filter on task, reason, error class or group, so only the
matching entries are read). It first counts what it has left to do where
the index can tell without reading entries, so its total is exact from the
start and a stop reports "N of M". After each chunk it writes its progress
(done, count, the cursor where the sweep goes on) with ``op_update.lua``,
which is also its heartbeat and tells it whether someone asked to cancel.

A worker that dies mid-way stops heartbeating; once its operation has been
silent for ``STALE_AFTER_MS`` another worker claims it and carries on from the
cursor. Nothing is replayed twice: each move deletes the entry and re-adds
the job in one step gated on the delete (``dlq_move.lua``), and entries a
sweep already moved are no longer there for the next one to find. The
figures may miss up to one chunk's worth then (moved, but the runner died
before writing that it had); the entries themselves are exact.

A worker that stops gracefully gives its operation back (state pending), and
the next worker takes it at once. ``rate`` (jobs per second) paces a replay
so it does not flood the workers: it moves at most a fifth of a second's worth
at a time and sleeps between, heartbeating while it waits.

With no worker serving the queue an operation waits; ``run_pending`` runs the
queue's pending operations in the calling process instead (what
``manage.py chasqui_operations`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chasqui_core.engine.store.connection import Client, connect
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.log_budget import LogBudget
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.dlq.entries import DeadJob, format_id, parse_id
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq import retention
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.dlq.selection import chunks, matching_total

logger = logging.getLogger("chasqui.operations")

KINDS = ("replay", "discard")
STATES = ("pending", "running", "done", "cancelled", "failed")
FINISHED = ("done", "cancelled", "failed")

CHUNK = 2000
"""Entries read (and at most moved) per call of a sweep: big enough for tens of thousands a second, small enough
that no call holds Redis for long."""
STALE_AFTER_MS = 15_000
"""An operation whose runner has written nothing for this long is taken over by another runner."""
KEEP_FINISHED_S = 7 * 24 * 3600
"""How long a finished operation's record stays in Redis (the console keeps its own lasting record)."""
POLL_S = 0.25
"""How often a worker looks for operations to run: what an operator waits at most before it starts."""
HEARTBEAT_S = 1.0
"""How often a rate-limited sweep writes while it waits between moves."""
PACE_SLICE_S = 0.2
"""With a rate, at most this many seconds' worth of jobs are moved in one go."""


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One operation as Redis holds it."""

    id: str
    queue: str
    kind: str
    filter: dict[str, Any]
    reset_attempts: bool
    run_at_ms: int | None
    rate: int | None
    """Jobs per second at most; None: as fast as it goes."""
    state: str
    done: int
    """Matching entries handled so far (including ones someone else removed meanwhile)."""
    total: int
    """Matching entries expected: an estimate until the operation ends (``total_exact``)."""
    total_exact: bool
    count: int
    """Entries this operation really replayed or discarded."""
    cursor: str
    """The id the sweep goes on from ("" before it started)."""
    owner: str
    heartbeat_ms: int
    cancel: bool
    error: str
    created_ms: int
    started_ms: int | None
    finished_ms: int | None
    claims: int
    """How many times a runner took it (more than 1: it was resumed after a runner stopped)."""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @classmethod
    def parse(cls, op_id: str, queue: str, raw: dict[bytes, bytes]) -> OperationRecord:
        d = {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}

        def num(name: str) -> int:
            text = d.get(name, "")
            return int(text) if text.lstrip("-").isdigit() else 0

        return cls(
            id=op_id,
            queue=queue,
            kind=d.get("kind", ""),
            filter=json.loads(d.get("filter") or "{}"),
            reset_attempts=d.get("reset_attempts", "1") == "1",
            run_at_ms=num("run_at_ms") if d.get("run_at_ms") else None,
            rate=num("rate") or None,
            state=d.get("state", ""),
            done=num("done"),
            total=num("total"),
            total_exact=d.get("total_exact") == "1",
            count=num("count"),
            cursor=d.get("cursor", ""),
            owner=d.get("owner", ""),
            heartbeat_ms=num("heartbeat"),
            cancel=d.get("cancel") == "1",
            error=d.get("error", ""),
            created_ms=num("created_ms"),
            started_ms=num("started_ms") if d.get("started_ms") else None,
            finished_ms=num("finished_ms") if d.get("finished_ms") else None,
            claims=num("claims"),
        )


def _check_rate(rate: int | None) -> int | None:
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
        raise ValueError(f"rate must be a whole number of jobs per second (1 or more), got {rate!r}")
    return rate


class _LostClaim(Exception):
    """Another runner owns the operation now: this one stops writing at once."""


class Operations:
    """One queue's DLQ operations on a sync redis-py client (bytes): record, read, cancel, claim and run them."""

    def __init__(self, client: Client, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.keys = QueueKeys.for_queue(queue)
        self.scripts = Scripts(client)

    # --- what the asking side calls ------------------------------------------------------------

    def submit(
        self,
        op_id: str,
        kind: str,
        filter: DLQFilter,
        *,
        reset_attempts: bool = True,
        run_at_ms: int | None = None,
        rate: int | None = None,
        total: int = 0,
        total_exact: bool = False,
    ) -> None:
        """Record an operation for a worker of the queue to run; ``total`` is the caller's count (or estimate)."""
        if kind not in KINDS:
            raise ValueError(f"Unknown operation kind {kind!r}: use one of {', '.join(KINDS)}")
        if not isinstance(filter, DLQFilter):
            raise TypeError(f"Pass a DLQFilter (DLQFilter() matches every entry), not {type(filter).__name__}")
        rate = _check_rate(rate)
        created = int(time.time() * 1000)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(
            self.keys.operation(op_id),
            mapping={
                "kind": kind,
                "filter": json.dumps(filter.to_dict()),
                "reset_attempts": "1" if reset_attempts else "0",
                "run_at_ms": "" if run_at_ms is None else str(run_at_ms),
                "rate": str(rate or 0),
                "state": "pending",
                "done": 0,
                "total": total,
                "total_exact": "1" if total_exact else "0",
                "count": 0,
                "cursor": "",
                "owner": "",
                "heartbeat": 0,
                "created_ms": created,
                "claims": 0,
            },
        )
        pipe.zadd(self.keys.operations, {op_id: created})
        pipe.execute()

    def get(self, op_id: str) -> OperationRecord | None:
        raw = self.client.hgetall(self.keys.operation(op_id))
        return OperationRecord.parse(op_id, self.queue, raw) if raw else None

    def pending(self) -> list[str]:
        """Ids of the unfinished operations, oldest first."""
        return [m.decode() for m in self.client.zrange(self.keys.operations, 0, -1)]

    def cancel(self, op_id: str) -> OperationRecord | None:
        """Ask an operation to stop; one nobody runs yet ends as cancelled now. None when there is no such one."""
        key = self.keys.operation(op_id)
        if not self.client.exists(key):
            return None
        self.client.hset(key, "cancel", "1")
        owner = f"canceller:{op_id}"
        if self._claim(op_id, owner, stale_ms=STALE_AFTER_MS) == 1:  # nobody was running it
            self._update(op_id, owner, "cancelled")
        return self.get(op_id)

    # --- what runners call ---------------------------------------------------------------------

    def claim_next(self, owner: str, *, stale_ms: int = STALE_AFTER_MS) -> str | None:
        """Take the oldest operation nobody (alive) runs; its id, or None."""
        for op_id in self.pending():
            if self._claim(op_id, owner, stale_ms=stale_ms) == 1:
                return op_id
        return None

    def run(
        self, op_id: str, owner: str, *, should_stop: Callable[[], bool] | None = None, chunk: int = CHUNK
    ) -> OperationRecord | None:
        """Carry out an operation this runner claimed, from where it stands, to its end.

        ``should_stop`` (the runner itself is stopping) is asked between
        chunks: the operation is then given back, to be resumed by another
        runner. Returns the record as it was left.
        """
        record = self.get(op_id)
        if record is None:
            return None
        try:
            if record.cancel:
                self._update(op_id, owner, "cancelled", total=max(record.total, record.done))
            else:
                self._sweep(record, owner, should_stop or (lambda: False), chunk)
        except _LostClaim:
            logger.warning("operation %s on %s: another runner took it over; this one stops", op_id, self.queue)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Redis went away for a moment: give the operation back rather than fail it; if even that cannot be
            # written, its heartbeat goes stale and a runner takes it over later, from its cursor
            logger.warning("operation %s on %s: Redis unavailable (%s); handing it back", op_id, self.queue, exc)
            with contextlib.suppress(Exception):
                self._update(op_id, owner, "pending")
            return None
        except Exception as exc:
            logger.exception("operation %s on %s failed", op_id, self.queue)
            try:
                self._update(op_id, owner, "failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            except Exception:  # Redis itself is gone: the record stays running and another runner resumes it
                logger.warning("operation %s on %s: could not record the failure", op_id, self.queue)
        return self.get(op_id)

    def _sweep(self, record: OperationRecord, owner: str, should_stop: Callable[[], bool], chunk: int) -> None:
        op_id = record.id
        dl = DeadLetters(self.client, self.queue)
        f = DLQFilter.from_dict(record.filter)
        sel = None if f.is_empty() else f
        bounds = dl._bounds(sel)
        edges = dl._edges()
        hi_text = self.client.hget(self.keys.operation(op_id), "hi")
        done, count = record.done, record.count
        if bounds is None or (edges is None and not hi_text):
            self._update(op_id, owner, "done", total=done, total_exact="1")
            return
        fields: dict[str, Any] = {}
        if hi_text:
            hi = parse_id(hi_text)
        else:
            # Only the entries present now: jobs that die during a long sweep are left for an operator to look at.
            assert edges is not None
            hi = min(bounds[1], edges[1])
            fields["hi"] = format_id(hi)
        lo = parse_id(record.cursor) if record.cursor else bounds[0]
        left = matching_total(dl, sel, lo, hi)
        total = max(record.total, done)
        if left is not None:  # known without reading entries: the figures are exact from the start
            total = done + left
            fields.update(total=total, total_exact="1")
        if fields:
            self._update(op_id, owner, "running", **fields)
        stopped = _Stop(self, op_id, owner, total)
        pace = _Pace(record.rate)
        burst = max(1, int(record.rate * PACE_SLICE_S)) if record.rate else chunk
        for step in chunks(dl, sel, lo, hi, chunk, decode=False):
            if should_stop():
                self._update(op_id, owner, "pending", done=done, count=count)
                return
            for start in range(0, len(step.ids), burst):
                ids = step.ids[start : start + burst]
                dead = step.dead[start : start + burst] if step.dead is not None else None
                count += self._act(dl, record, ids, dead)
                done += len(ids)
                pace.moved(len(ids))
                last = start + burst >= len(step.ids)
                cursor = (step.cursor or step.start) if last else step.start
                if self._update(op_id, owner, "running", done=done, count=count, cursor=cursor):
                    stopped.cancelled(done)
                    return
                if not pace.wait(lambda: self._update(op_id, owner, "running") or should_stop()):
                    if should_stop():
                        self._update(op_id, owner, "pending")
                    else:
                        stopped.cancelled(done)
                    return
            if not step.ids and step.cursor is not None and self._update(op_id, owner, "running",
                                                                         cursor=step.cursor):
                stopped.cancelled(done)
                return
        self._update(op_id, owner, "done", done=done, count=count, total=done, total_exact="1")

    def _act(self, dl: DeadLetters, record: OperationRecord, ids: list[str], dead: list[DeadJob] | None) -> int:
        if not ids:
            return 0
        if record.kind == "replay":
            return dl._replay_ids(ids, record.reset_attempts, record.run_at_ms)
        return dl._discard(ids)

    # --- the scripts ---------------------------------------------------------------------------

    def _claim(self, op_id: str, owner: str, *, stale_ms: int) -> int:
        return int(
            self.scripts.op_claim(
                keys=[self.keys.operation(op_id), self.keys.operations], args=[owner, stale_ms, op_id]
            )
        )

    def _update(self, op_id: str, owner: str, state: str, **fields: Any) -> bool:
        """Write; True when a cancel was asked. Raises _LostClaim when another runner owns it now."""
        args: list[Any] = [owner, state, op_id, KEEP_FINISHED_S]
        for name, value in fields.items():
            args += (name, value)
        reply = int(self.scripts.op_update(keys=[self.keys.operation(op_id), self.keys.operations], args=args))
        if reply < 0:
            raise _LostClaim(op_id)
        return reply == 1


class _Stop:
    """Ends a sweep that was asked to stop, saying how many of how many it handled.

    The total stays what it was (exact when the sweep could count its
    matches, else the estimate): "30,800 of 100,000", never "30,800 of
    30,800". It grows only if more were handled than estimated.
    """

    def __init__(self, ops: Operations, op_id: str, owner: str, total: int) -> None:
        self.ops, self.op_id, self.owner, self.total = ops, op_id, owner, total

    def cancelled(self, done: int) -> None:
        self.ops._update(self.op_id, self.owner, "cancelled", total=max(self.total, done))


class _Pace:
    """Keeps a sweep under ``rate`` jobs a second (no limit when None)."""

    def __init__(self, rate: int | None) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.count = 0

    def moved(self, n: int) -> None:
        self.count += n

    def wait(self, beat: Callable[[], bool]) -> bool:
        """Sleep until the rate allows more, calling ``beat`` every HEARTBEAT_S; False when ``beat`` says stop."""
        if not self.rate:
            return True
        due = self.started + self.count / self.rate
        while True:
            left = due - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, HEARTBEAT_S))
            if due - time.monotonic() > 0 and beat():
                return False


def run_pending(
    client: Client,
    queue: str,
    owner: str,
    *,
    should_stop: Callable[[], bool] | None = None,
    stale_ms: int = STALE_AFTER_MS,
) -> list[OperationRecord]:
    """Run the queue's pending operations here, one after another, until none is left to claim."""
    ops = Operations(client, queue)
    out: list[OperationRecord] = []
    while should_stop is None or not should_stop():
        op_id = ops.claim_next(owner, stale_ms=stale_ms)
        if op_id is None:
            break
        record = ops.run(op_id, owner, should_stop=should_stop)
        if record is not None:
            out.append(record)
    return out


class OperationsLoop:
    """The worker's part that runs its queues' operations, in a thread of its own with a sync client; it also
    trims its queues' DLQs to their retention rules every ``retention.TRIM_EVERY_S``.

    Sweeps are blocking work (scripts of a few milliseconds, decoding and
    encoding envelopes), so they stay off the worker's event loop and never
    delay its jobs.
    """

    def __init__(self, url: str | None, owner: str, queues: list[str], stopping: asyncio.Event) -> None:
        self.url = url
        self.owner = owner
        """The worker id claims are made in."""
        self.queues = queues
        self.stopping = stopping
        self._away = LogBudget(logger, "operations passes skipped while Redis could not be reached", per_second=1)

    async def run(self) -> None:
        stop = threading.Event()
        try:
            await asyncio.to_thread(self._run, stop)
        finally:
            stop.set()

    def _run(self, stop: threading.Event) -> None:
        client = connect(self.url)
        try:
            ops = [Operations(client, q) for q in self.queues]

            def stopping() -> bool:
                return stop.is_set() or self.stopping.is_set()

            trimmed_at = 0.0
            while not stopping():
                if time.monotonic() - trimmed_at >= retention.TRIM_EVERY_S:
                    trimmed_at = time.monotonic()
                    self._trim(client)
                ran = False
                for o in ops:
                    try:
                        op_id = o.claim_next(self.owner)
                    except (RedisConnectionError, RedisTimeoutError) as exc:  # Redis restarting: not an error of ours
                        if self._away.allow():
                            logger.warning("operations on %s: Redis cannot be reached (%s); trying again", o.queue,
                                           exc)
                        break
                    if op_id is not None:
                        ran = True
                        record = o.run(op_id, self.owner, should_stop=stopping)
                        if record is not None:
                            logger.info(
                                "operation %s on %s: %s, %d of %d handled",
                                op_id,
                                o.queue,
                                record.state,
                                record.done,
                                record.total,
                            )
                if not ran:
                    stop.wait(POLL_S)
        finally:
            client.close()

    def _trim(self, client: Client) -> None:
        """Trim each queue's DLQ to its retention rule (``retention.py``); a failure waits for the next pass."""
        for queue in self.queues:
            try:
                removed = retention.trim(client, queue, retention.read(client, queue))
            except (RedisConnectionError, RedisTimeoutError) as exc:
                logger.warning("trimming the DLQ of %s: Redis unavailable (%s)", queue, exc)
                return
            if removed:
                logger.info("trimmed %d dead job(s) from the DLQ of %s (its retention rule)", removed, queue)
