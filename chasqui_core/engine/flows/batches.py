"""Batches in Redis: start a workflow, grow a running batch, read a batch's state.

A batch's id names its queue (``<queue>:<ULID>``): every key of a workflow
lives under that queue's hash tag, so the scripts that count its children's
ends and fire its callbacks touch one slot, on a cluster too. That is also
why a workflow's jobs all run on one queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from chasqui_core.engine.jobs.envelope import new_job_id
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys, validate_queue_name
from chasqui_core.engine.store.scripts import Scripts

_pack_items = msgpack.Packer(use_bin_type=False).pack
"""str types only: the scripting engine's msgpack reads raw strings, not bin."""

KEEP_MS = 7 * 24 * 3600 * 1000
"""How long a batch's keys are kept after it starts and after it completes, unless the caller says."""

READ_CHUNK = 1000
"""Children read per command when a batch is read (a fan-in of 10,000 is ten round trips)."""


ID_PATTERN = r"^[A-Za-z0-9_.\-]{1,100}:[0-9A-HJKMNP-TV-Z]{26}(-[1-9][0-9]{0,5})?$"
"""What a batch id looks like: its queue, a colon, a ULID; a chain's step adds ``-<step>``."""


class UnknownBatch(LookupError):
    """No batch has this id (it never existed, or its keys expired)."""


def new_batch_id(queue: str) -> str:
    return f"{validate_queue_name(queue)}:{new_job_id()}"


def queue_of(batch_id: str) -> str:
    """The queue a batch id names; ValueError, in words, for a string that is not a batch id."""
    queue, sep, rest = batch_id.partition(":") if isinstance(batch_id, str) else ("", "", "")
    if not sep or not rest or ":" in rest:
        raise ValueError(f"{batch_id!r:.80} is not a batch id (expected <queue>:<id>)")
    return validate_queue_name(queue)


def flow_key(keys: QueueKeys, batch_id: str) -> str:
    return f"{keys.prefix}flow:{batch_id}"


@dataclass(slots=True)
class BatchPlan:
    """One batch to write when a workflow starts."""

    id: str
    children: list[str]
    """Its children's job ids, in the order given (the order of its results)."""
    fields: list[Any] = field(default_factory=list)
    """More hash fields laid flat: its callbacks (``callbacks.stored``), its place in a chain."""


def start(client: Client, keys: QueueKeys, batches: list[BatchPlan], jobs: list[bytes],
          keep_ms: int = KEEP_MS) -> int:
    """Write ``batches`` and add ``jobs`` (the children that run first) in one atomic call.

    Returns how many jobs were added; 0 when the first batch existed already (a repeated call adds nothing).
    """
    return start_encoded(client, keys, encode_start(batches, jobs), keep_ms)


def encode_start(batches: list[BatchPlan], jobs: list[bytes]) -> bytes:
    """``start``'s arguments as one value, for a start that waits (an outbox row): ``start_encoded`` sends it."""
    flat: list[Any] = []
    for b in batches:
        flat += (b.id, b.children, b.fields)
    encoded: bytes = msgpack.packb([_pack_items(flat), _pack_items(jobs)], use_bin_type=True)
    return encoded


def start_encoded(client: Client, keys: QueueKeys, encoded: bytes, keep_ms: int = KEEP_MS) -> int:
    """``start`` with arguments ``encode_start`` made; as idempotent (a row relayed twice starts it once)."""
    flat, jobs = msgpack.unpackb(encoded, raw=True)
    added = int(Scripts(client).flow_start(keys=[keys.stream], args=[keys.metrics, keep_ms, flat, jobs]))
    return max(added, 0)


def add(client: Client, keys: QueueKeys, batch_id: str, parent_id: str, jobs: list[tuple[str, bytes]]) -> int:
    """Add jobs (id, envelope) to running batch ``batch_id`` on behalf of its running child ``parent_id``."""
    flat: list[Any] = []
    for job_id, payload in jobs:
        flat += (job_id, payload)
    return int(Scripts(client).flow_add(keys=[keys.stream], args=[keys.metrics, batch_id, parent_id,
                                                                    _pack_items(flat)]))


@dataclass(frozen=True, slots=True)
class Callback:
    """A batch's callback: its job id, and whether the batch has enqueued it."""

    job_id: str
    fired: bool


@dataclass(frozen=True, slots=True)
class BatchState:
    """A batch as read from Redis at one moment."""

    id: str
    queue: str
    total: int
    succeeded: int
    dead: int
    """Children dead-lettered and not discarded (a replay that succeeds moves one to ``succeeded``)."""
    discarded: int
    children: list[str]
    states: list[str]
    """Each child's state, in order: ``pending`` (not ended yet), ``succeeded``, ``dead`` or ``discarded``."""
    results: list[Any]
    """Each child's return value, in order (None until it succeeds)."""
    callbacks: dict[str, Callback]
    """``success`` and ``complete``, when the batch has them."""
    chain: str | None = None
    step: int = 0
    steps: int = 0

    @property
    def ended(self) -> int:
        return self.succeeded + self.dead + self.discarded

    @property
    def status(self) -> str:
        """``running`` until every child ended; then ``succeeded`` when all did, else ``failed``."""
        if self.ended < self.total:
            return "running"
        return "succeeded" if self.succeeded == self.total else "failed"


_STATES = {b"ok": "succeeded", b"dead": "dead", b"gone": "discarded", None: "pending"}


def read(client: Client, batch_id: str) -> BatchState:
    """The state of batch ``batch_id``; ``UnknownBatch`` when there is none, ValueError for a malformed id."""
    keys = QueueKeys.for_queue(queue_of(batch_id))
    key = flow_key(keys, batch_id)
    head = client.hmget(key, ["total", "ok", "dead", "gone", "success:id", "fired:success", "complete:id",
                              "fired:complete", "chain", "step", "steps"])
    if head[0] is None:
        raise UnknownBatch(f"no batch {batch_id!r}: it never existed, or it ended long enough ago to expire")
    total, ok, dead, gone, sid, sfired, cid, cfired, chain, step, steps = head
    children: list[str] = []
    states: list[str] = []
    results: list[Any] = []
    start_at = 0
    while True:
        ids = client.lrange(key + ":kids", start_at, start_at + READ_CHUNK - 1)
        if not ids:
            break
        names = [i.decode() for i in ids]
        fields = [f"k:{i}" for i in names] + [f"r:{i}" for i in names]
        values = client.hmget(key, fields)
        n = len(names)
        children += names
        states += [_STATES.get(v, "pending") for v in values[:n]]
        results += [None if v is None else msgpack.unpackb(v) for v in values[n:]]
        start_at += len(ids)
    callbacks = {}
    if sid is not None:
        callbacks["success"] = Callback(sid.decode(), sfired is not None)
    if cid is not None:
        callbacks["complete"] = Callback(cid.decode(), cfired is not None)
    return BatchState(batch_id, keys.queue, int(total), int(ok or 0), int(dead or 0), int(gone or 0), children,
                      states, results, callbacks, chain.decode() if chain else None, int(step or 0),
                      int(steps or 0))
