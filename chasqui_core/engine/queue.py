"""The producer side: put jobs on a queue.

``Queue.add`` is one round trip; ``Queue.add_bulk`` is one round trip per
chunk, both through ``enqueue.lua`` so that ready and delayed jobs, caller-given
ids and the enqueued counter are handled in the same atomic call.
"""

from __future__ import annotations

import asyncio
import time

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgpack
import redis
import redis.asyncio as aredis

from .backoff import BackoffSpec, coerce_backoff
from .connection import aconnect, connect, url_of
from .envelope import check_json_types, new_job_id, now_ms, pack_job
from .keys import QUEUES_REGISTRY, QueueKeys
from .scripts import Scripts

DEFAULT_UNIQUE_TTL_MS = 24 * 3600 * 1000
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_CHUNK_SIZE = 1000


_pack_items = msgpack.Packer(use_bin_type=False).pack


class PayloadTooLarge(ValueError):
    """An encoded job is bigger than the queue accepts."""


@dataclass(slots=True)
class JobSpec:
    """One job for ``add_bulk``; the same options as ``Queue.add``."""

    task: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    delay: timedelta | int | float | None = None
    run_at: datetime | None = None
    attempts: int | None = None
    backoff: BackoffSpec | int | dict | str | None = None
    result_ttl: int = 0
    meta: Mapping[str, Any] | None = None


class Enqueued(NamedTuple):
    """What became of one added job (a named tuple: bulk adds make one per job)."""

    job_id: str
    queue: str
    entry_id: str | None
    """Stream entry id when the job is ready now; None when delayed or a duplicate."""
    delayed: bool = False
    duplicate: bool = False
    """True when a job with the same caller-given id was added within the idempotency window."""


def _when(delay: timedelta | int | float | None, run_at: datetime | None) -> str:
    if delay is not None and run_at is not None:
        raise ValueError("Give either delay= or run_at=, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise TypeError(f"run_at must be a datetime, not {type(run_at).__name__}")
        if run_at.tzinfo is None:
            raise ValueError("run_at must be a timezone-aware datetime")
        return "@" + str(int(run_at.timestamp() * 1000))
    if delay is None:
        return ""
    if isinstance(delay, timedelta):
        ms = delay.total_seconds() * 1000
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        ms = float(delay)
    else:
        raise TypeError(f"delay must be a timedelta or a number of milliseconds, not {type(delay).__name__}")
    if ms != ms or ms < 0:
        raise ValueError(f"delay must be 0 or more, got {delay!r}")
    return "+" + str(int(ms)) if ms > 0 else ""


class Queue:
    """A named queue on one Redis server.

    Pass a redis-py client (sync) or a URL; an asyncio twin is created on the
    first ``a``-prefixed call, because asyncio clients belong to one loop.
    """

    def __init__(
        self,
        name: str,
        *,
        redis_client: redis.Redis | None = None,
        url: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        unique_ttl_ms: int = DEFAULT_UNIQUE_TTL_MS,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> None:
        self.keys = QueueKeys.for_queue(name)
        self.name = name
        self.redis = redis_client if redis_client is not None else connect(url)
        self._url = url
        self._aredis: aredis.Redis | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._scripts = Scripts(self.redis)
        self._ascripts: Scripts | None = None
        self.max_payload_bytes = max_payload_bytes
        self.unique_ttl_ms = unique_ttl_ms
        self.chunk_size = chunk_size
        self._registered = False
        self._expired_at = 0

    # --- building jobs ------------------------------------------------------

    def build(self, spec: JobSpec) -> tuple[str, str, bytes, str]:
        """Validate one job; return (caller job id or "", when, payload, job id).

        This runs once per job on the producer's hot path, so the common case
        (no options) skips straight to packing.
        """
        task = spec.task
        if type(task) is not str or not task:
            raise ValueError("A job needs a task name (a non-empty string)")
        args = list(spec.args)
        kwargs = spec.kwargs if type(spec.kwargs) is dict else dict(spec.kwargs)
        check_json_types(args, "args")
        if kwargs:
            check_json_types(kwargs, "kwargs")
        attempts = spec.attempts
        if attempts is not None and (type(attempts) is not int or attempts < 1):
            raise ValueError(f"attempts must be a whole number of 1 or more, got {attempts!r}")
        backoff = spec.backoff
        if backoff is not None:
            backoff = coerce_backoff(backoff).to_dict()  # type: ignore[union-attr]
        job_id = spec.job_id
        if job_id is not None and (type(job_id) is not str or not job_id or len(job_id) > 200):
            raise ValueError("job_id must be a non-empty string of at most 200 characters")
        when = "" if spec.delay is None and spec.run_at is None else _when(spec.delay, spec.run_at)
        result_ttl = spec.result_ttl
        if type(result_ttl) is not int or result_ttl < 0:
            raise ValueError(f"result_ttl must be a whole number of seconds, got {result_ttl!r}")
        meta = dict(spec.meta) if spec.meta else {}
        if meta:
            check_json_types(meta, "meta")
        jid = job_id or new_job_id()
        payload = pack_job(jid, task, args, kwargs, now_ms(), attempts, backoff, result_ttl, meta)
        if len(payload) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"Job for task {task!r} is {len(payload)} bytes once encoded; "
                f"the queue accepts at most {self.max_payload_bytes} bytes. "
                "Pass a reference (a row id, a file path) instead of the data."
            )
        return (job_id or "", when, payload, jid)

    def _argv(self, built: list) -> list:
        flat: list = []
        for uid, when, payload, _ in built:
            flat += (uid, when, payload)
        # str type for every item: the scripting engine's msgpack reads raw strings
        return [self.keys.unique, self.unique_ttl_ms, self.keys.metrics, _pack_items(flat)]

    def _results(self, built: list, replies: list) -> list[Enqueued]:
        name = self.name
        out = []
        append = out.append
        for (_, _, _, job_id), reply in zip(built, replies):
            if reply == 0:
                append(Enqueued(job_id, name, None, False, True))
            elif reply == b"delayed":
                append(Enqueued(job_id, name, None, True, False))
            else:
                append(Enqueued(job_id, name, reply.decode(), False, False))
        return out

    def _chunks(self, jobs: Iterable[JobSpec]) -> Iterable[list]:
        chunk: list = []
        for spec in jobs:
            chunk.append(self.build(spec))
            if len(chunk) >= self.chunk_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def _register(self) -> None:
        if not self._registered:
            self.redis.sadd(QUEUES_REGISTRY, self.name)
            self._registered = True

    # --- sync API -------------------------------------------------------------

    def add(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Enqueued:
        """Add one job. Options: job_id, delay, run_at, attempts, backoff, result_ttl, meta."""
        return self.add_built(self.build(JobSpec(task, args, kwargs or {}, **options)))

    def add_built(self, built: tuple[str, str, bytes, str]) -> Enqueued:
        """Send one job returned by ``build`` (validate now, send later: on commit, say)."""
        self._register()
        if not built[0] and not built[1]:
            return self._add_ready(built)
        return self._enqueue_chunk([built])[0]

    def add_built_many(self, built: Sequence[tuple[str, str, bytes, str]]) -> list[Enqueued]:
        """Send jobs returned by ``build``, one round trip per chunk of ``chunk_size``."""
        if len(built) == 1:
            return [self.add_built(built[0])]
        self._register()
        out: list[Enqueued] = []
        for start in range(0, len(built), self.chunk_size):
            out += self._enqueue_chunk(list(built[start:start + self.chunk_size]))
        return out

    def _enqueue_chunk(self, chunk: list) -> list[Enqueued]:
        """One ``enqueue.lua`` call for built jobs."""
        reply = self._scripts.enqueue(keys=[self.keys.stream, self.keys.delayed], args=self._argv(chunk))
        return self._results(chunk, reply)

    def _add_ready(self, built: tuple[str, str, bytes, str]) -> Enqueued:
        """The common single add (ready now, no caller id): plain commands, no script.

        A script call costs the server far more than an XADD for one job, so
        this path sends XADD and the counter increments as one packed write on
        a pooled connection. Counters use this process's clock here, the
        server's in the scripts; they agree to within clock skew.
        """
        sec = int(time.time())
        second, minute = f"{self.keys.metrics}s:{sec}", f"{self.keys.metrics}m:{sec // 60}"
        commands = [("XADD", self.keys.stream, "*", "j", built[2]),
                    ("HINCRBY", second, "enqueued", 1), ("HINCRBY", minute, "enqueued", 1)]
        if sec != self._expired_at:
            commands += [("EXPIRE", second, 3720), ("EXPIRE", minute, 90000)]
        replies = self._send(commands)
        self._expired_at = sec
        return Enqueued(built[3], self.name, replies[0].decode(), False, False)

    def _send(self, commands: list[tuple]) -> list[Any]:
        pool = self.redis.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            replies, error = [], None
            for _ in commands:  # read every reply, even after an error, to keep the connection in step
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    error = error or exc
                    replies.append(None)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if error is not None:
            raise error
        return replies

    def add_encoded(self, items: Sequence[tuple[str, str, bytes]]) -> list[Enqueued]:
        """Add jobs encoded earlier by ``build``: (job id, when, payload) triples.

        The job id doubles as the idempotency key, so sending the same job
        twice (a relay retrying after a lost reply) adds it once.
        """
        self._register()
        out: list[Enqueued] = []
        for start in range(0, len(items), self.chunk_size):
            out += self._enqueue_chunk(
                [(job_id, when, payload, job_id) for job_id, when, payload in items[start:start + self.chunk_size]])
        return out

    def add_bulk(self, jobs: Iterable[JobSpec]) -> list[Enqueued]:
        """Add many jobs, one round trip per chunk of ``chunk_size``.

        Every job of a chunk is validated before the chunk is sent, so a bad job
        raises before any job of its chunk reaches Redis.
        """
        out: list[Enqueued] = []
        for chunk in self._chunks(jobs):
            self._register()
            out += self._enqueue_chunk(chunk)
        return out

    # --- asyncio API ------------------------------------------------------------

    def _async(self) -> tuple[aredis.Redis, Scripts]:
        # asyncio connections belong to the loop that opened them
        loop = asyncio.get_running_loop()
        if self._aredis is None or self._aloop is not loop:
            self._aredis = aconnect(self._url or url_of(self.redis))
            self._ascripts = Scripts(self._aredis)
            self._aloop = loop
        return self._aredis, self._ascripts  # type: ignore[return-value]

    async def aadd(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Enqueued:
        return (await self.aadd_bulk([JobSpec(task, args, kwargs or {}, **options)]))[0]

    async def aadd_bulk(self, jobs: Iterable[JobSpec]) -> list[Enqueued]:
        out: list[Enqueued] = []
        for chunk in self._chunks(jobs):  # each chunk validated before it is written
            out += await self.aadd_built_many(chunk)
        return out

    async def aadd_built_many(self, built: Sequence[tuple[str, str, bytes, str]]) -> list[Enqueued]:
        """Send jobs returned by ``build`` from async code, one round trip per chunk."""
        client, scripts = self._async()
        if not self._registered:
            await client.sadd(QUEUES_REGISTRY, self.name)
            self._registered = True
        out: list[Enqueued] = []
        for start in range(0, len(built), self.chunk_size):
            chunk = list(built[start:start + self.chunk_size])
            reply = await scripts.enqueue(keys=[self.keys.stream, self.keys.delayed], args=self._argv(chunk))
            out += self._results(chunk, reply)
        return out

    async def aclose(self) -> None:
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None
