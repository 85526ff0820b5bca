"""The producer side: put jobs on a queue.

Every add is one atomic script call: ``Queue.add_bulk`` one ``enqueue.lua``
call per chunk, so that ready and delayed jobs, caller-given ids, the enqueued
counter and the lane that makes a re-sent write harmless (see ``link.py``) are
handled together. A single plain job (ready now, default priority, no
caller-given id: most adds) goes through ``enqueue_plain.lua``, which does
only what such a job needs, since the caller waits for it. A write that meets
a restarting or failing-over server is retried until ``retry_for`` seconds
after the call began, then ``EnqueueUnavailable`` is raised; a retry never
adds a job twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from chasqui_core.engine.jobs.errors import EnqueueUnavailable
from chasqui_core.engine.jobs.idempotency import DEFAULT_TTL, check_ttl
from chasqui_core.engine.jobs.signing import Signer
from chasqui_core.engine.ops import cancel
from chasqui_core.engine.producer import wire
from chasqui_core.engine.producer.jobspec import (BuiltJob, Enqueued, JobSpec, JobTemplate, PayloadTooLarge,
                                                  has_options, template)
from chasqui_core.engine.producer.link import Lane, Link, Retrier, process_id, unavailable
from chasqui_core.engine.store.connection import (aconnect, ais_cluster, connect, is_cluster_client, server_of,
                                                  undetected, url_of)
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.timing import delayed

__all__ = ["BuiltJob", "Enqueued", "JobSpec", "JobTemplate", "PayloadTooLarge", "Queue"]
"""The value types live in jobspec.py; they are named here too, where callers have always found them."""

DEFAULT_UNIQUE_TTL_MS = 24 * 3600 * 1000
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_CHUNK_SIZE = 1000
DEFAULT_RETRY_FOR = 5.0
"""Seconds a producer keeps retrying an add while Redis is unavailable (a restart, a failover)."""
_monotonic = time.monotonic
_enqueued = Enqueued._make

_Pending = tuple[list[Any], bytes, bytes, int, BaseException | None]
"""A write on its way: its jobs, its sequence number, its first try's bytes and reply count, and the error that
kept it from being sent (None once sent)."""


class Queue:
    """A named queue on one Redis server.

    Pass a redis-py client (sync) or a URL; an asyncio twin is created on the
    first ``a``-prefixed call, because asyncio clients belong to one loop.
    With ``signing_key`` every job is signed (see signing.py): workers given
    that key among their ``signing_keys`` run only signed jobs.
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
        retry_for: float = DEFAULT_RETRY_FOR,
        signing_key: bytes | str | None = None,
        idempotency_ttl: int = DEFAULT_TTL,
    ) -> None:
        if isinstance(retry_for, bool) or not isinstance(retry_for, (int, float)) or not 0 <= retry_for <= 3600:
            raise ValueError(f"retry_for must be a number of seconds from 0 to 3600, got {retry_for!r}")
        if signing_key is not None and (not isinstance(signing_key, (str, bytes)) or not signing_key):
            raise ValueError(f"signing_key must be a non-empty string or bytes (or None: jobs are not signed), "
                             f"got {type(signing_key).__name__}")
        self.keys = QueueKeys.for_queue(name)
        self.name = name
        self._url = url
        self._aredis: aredis.Redis | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._ascripts: Scripts | None = None
        self.max_payload_bytes = max_payload_bytes
        self.unique_ttl_ms = unique_ttl_ms
        self.chunk_size = chunk_size
        self.retry_for = float(retry_for)
        self._signer = Signer([signing_key]) if signing_key is not None else None
        self.idempotency_ttl = check_ttl(idempotency_ttl)
        self._registered = False
        self._plain: dict[str, JobTemplate] = {}
        self._links: list[Link] = []
        self._alanes: list[Lane] = []
        self._use(redis_client if redis_client is not None else connect(url))

    def _use(self, client: Any) -> None:
        """Send through ``client`` from now on (made anew once a server that did not answer at first does)."""
        self.redis = client
        self._scripts = Scripts(client)
        self._cluster = is_cluster_client(client)
        # on a cluster the registry lives in a slot of its own, likely on another node than the queue
        self._register_cmd = b"" if self._cluster else wire.pack_command(("SADD", QUEUES_REGISTRY, self.name))
        self._owned_undetected = self._url is not None and undetected(client)

    # --- building jobs ------------------------------------------------------

    def build(self, spec: JobSpec) -> BuiltJob:
        """Validate and encode one job (``jobspec.build``, with this queue's signing key, idempotency window and
        payload limit)."""
        if type(spec.task) is str and not has_options(spec):
            return self._plain_template(spec.task).build(spec.args, spec.kwargs)
        return self.template(spec).build(spec.args, spec.kwargs)

    def _plain_template(self, task: str) -> JobTemplate:
        """The template of a job of ``task`` without options, checked once per task name."""
        plain = self._plain.get(task)
        if plain is None:
            plain = self.template(JobSpec(task))
            if len(self._plain) >= 1024:
                self._plain.clear()
            self._plain[task] = plain
        return plain

    def template(self, spec: JobSpec) -> JobTemplate:
        """A spec's options checked once, for building many jobs with this queue's settings (its arguments are
        not looked at): ``jobspec.template``."""
        return template(spec, signer=self._signer, idempotency_ttl=self.idempotency_ttl,
                        max_payload_bytes=self.max_payload_bytes)

    def _results(self, built: list[Any], replies: list[Any]) -> list[Enqueued]:
        name = self.name
        out: list[Enqueued] = []
        append = out.append
        for (_, _, _, job_id), reply in zip(built, replies, strict=False):
            if reply == 0:
                append(Enqueued(job_id, name, None, False, True))
            elif reply == b"delayed":
                append(Enqueued(job_id, name, None, True, False))
            else:
                append(Enqueued(job_id, name, reply.decode(), False, False))
        return out

    def _chunks(self, jobs: Iterable[JobSpec]) -> Iterable[list[Any]]:
        chunk: list[Any] = []
        for spec in jobs:
            chunk.append(self.build(spec))
            if len(chunk) >= self.chunk_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    # --- sending ----------------------------------------------------------------

    def _take_link(self) -> Link:
        """A link no other write is using (one per thread that adds at the same time)."""
        if self._owned_undetected:  # the server did not answer when this queue was made: is it a cluster?
            client = connect(self._url)
            if not undetected(client):
                self.close()
                self._use(client)
        try:
            link = self._links.pop()
        except IndexError:
            link = None
        # a forked child never shares its parent's sockets; a link made for an earlier client is dropped
        if link is None or link.pid != process_id() or link.client is not self.redis:
            if link is not None:
                self._links = []
            k = self.keys
            link = Link(self.redis, connect_timeout=min(5.0, max(1.0, self.retry_for)), key=k.stream)
            link.cache["heads"] = wire.heads(k, link.lane, self.unique_ttl_ms)
        return link

    def _request(self, link: Link, chunk: list[Any], seq: bytes, again: bool) -> tuple[bytes, int]:
        """Pack one try of a write (``wire.request``) and how many replies it gets."""
        packed = wire.request(link.cache["heads"], chunk, seq, again)
        if self._registered or self._cluster:
            return packed, 1
        return self._register_cmd + packed, 2

    def _start(self, link: Link, chunk: list[Any]) -> _Pending:
        """Send one write without waiting for its reply (a bulk add builds the next chunk meanwhile).

        The write's retry window opens now: no try of it waits past ``retry_for`` seconds from here.
        """
        retry_for = self.retry_for
        link.deadline = _monotonic() + retry_for if retry_for else None
        seq = b"%d" % link.next_number()
        packed, count = self._request(link, chunk, seq, False)
        try:
            link.send(packed)
        except Exception as exc:
            if not unavailable(exc):
                raise
            return chunk, seq, packed, count, exc  # not sent: _finish retries it
        return chunk, seq, packed, count, None

    def _finish(self, link: Link, pending: _Pending) -> list[Enqueued]:
        """Read the reply of a write started by ``_start``, retrying it while Redis is unavailable."""
        chunk, seq, packed, count, error = pending
        retrier: Retrier | None = None
        while True:
            if error is None:
                try:
                    reply = self._receive(link, packed, count)[-1]
                    if not self._registered:
                        self._register()
                    if type(reply) is bytes:  # enqueue_plain.lua's: the entry id of its one job
                        return [_enqueued((chunk[0][3], self.name, reply.decode(), False, False))]
                    return self._results(chunk, reply)
                except Exception as exc:
                    if not unavailable(exc):
                        raise
                    error = exc
            retrier = retrier or Retrier(self.retry_for, link.deadline)
            wait = retrier.pause(error, sent=getattr(error, "sent", True))
            if wait is None:
                raise self._unavailable(error, retrier, chunk, link.server) from error
            time.sleep(wait)
            link.follow(error)  # on a cluster: to the slot's master now
            packed, count = self._request(link, chunk, seq, True)  # same lane, same number: the lane is read
            try:
                link.send(packed)
                error = None
            except Exception as exc:
                if not unavailable(exc):
                    raise
                error = exc

    def _register(self) -> None:
        """Note the queue in the registry; on a cluster with a command of its own (another slot)."""
        if self._cluster:
            try:
                self.redis.sadd(QUEUES_REGISTRY, self.name)
            except Exception as exc:  # the jobs are in: the next add registers the queue
                if not unavailable(exc):
                    raise
                return
        self._registered = True

    @staticmethod
    def _receive(link: Link, packed: bytes, count: int) -> list[Any]:
        try:
            return link.receive(count)
        except redis.ResponseError as exc:
            if not isinstance(exc, redis.exceptions.NoScriptError) and not str(exc).startswith("NOSCRIPT"):
                raise
        # a restarted server has forgotten the scripts: load them and send again, one round trip
        link.send(wire.LOAD_BOTH + packed)
        return link.receive(count + 2)[2:]

    def _unavailable(self, cause: BaseException, retrier: Retrier, chunk: list[Any], server: str) -> EnqueueUnavailable:
        jobs = f"{len(chunk)} jobs" if len(chunk) != 1 else f"job {chunk[0].job_id}"
        fate = ("A write was sent before the connection broke, so they may have been added."
                if retrier.maybe_run else "Nothing was added.")
        return EnqueueUnavailable(
            f"Could not add {jobs} to queue {self.name!r}: the Redis server at {server} was unavailable "
            f"for {retrier.retry_for:g}s ({retrier.tries} tries; last error: {type(cause).__name__}: {cause}). "
            f"{fate}",
            server=server, cause=cause, job_ids=[b.job_id for b in chunk], maybe_added=retrier.maybe_run)

    def _write_chunks(self, chunks: Iterable[list[Any]],
                      meanwhile: Callable[[list[BuiltJob]], None] | None = None) -> list[Enqueued]:
        """Send chunks on one link, one in flight: the next chunk is built while Redis runs the last.

        ``meanwhile`` runs with each chunk as soon as it is sent (see ``add_built_many``).
        """
        out: list[Enqueued] = []
        link = self._take_link()
        pending = None
        try:
            try:
                for chunk in chunks:
                    if pending is not None:
                        done, pending = pending, None
                        out += self._finish(link, done)
                    pending = self._start(link, chunk)
                    if meanwhile is not None:
                        meanwhile(chunk)
            except BaseException:
                if pending is not None:  # a later chunk failed to build: this one was sent, see it through
                    done, pending = pending, None
                    self._finish(link, done)
                raise
            if pending is not None:
                done, pending = pending, None
                out += self._finish(link, done)
        except EnqueueUnavailable as exc:
            exc.added = out
            raise
        finally:
            self._links.append(link)
        return out

    def close(self) -> None:
        """Close this queue's own connections (the client passed in stays open)."""
        links, self._links = self._links, []
        for link in links:
            link.close()

    # --- cancelling --------------------------------------------------------------

    def cancel(self, job_id: str) -> cancel.CancelRequest:
        """Ask for a job of this queue to be cancelled, whatever its state: waiting, delayed or running.

        A waiting or delayed job never runs; a running async job is cancelled
        within a second; a running sync job is told (``JobContext.cancelled``)
        and given up after the worker's grace. Each ends in the dead-letter
        queue with reason ``cancelled`` (see cancel.py). Asking again is harmless.
        """
        if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
            raise ValueError("job_id must be a non-empty string of at most 200 characters")
        found = delayed.find(self.redis, self.name, job_id)
        return cancel.request(self.redis, self.name, job_id, found.member if found is not None else None)

    # --- sync API -------------------------------------------------------------

    def add(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Enqueued:
        """Add one job. Options: job_id, delay, run_at, attempts, backoff, result_ttl, meta, idempotency_key,
        idempotency_ttl, timeout, limit_key, priority (see JobSpec)."""
        if options or type(task) is not str:
            return self.add_built(self.build(JobSpec(task, args, kwargs or {}, **options)))
        return self.add_built(self._plain_template(task).build(args, kwargs or {}))

    def add_built(self, built: BuiltJob) -> Enqueued:
        """Send one job returned by ``build`` (validate now, send later: on commit, say)."""
        link = self._take_link()
        try:
            return self._finish(link, self._start(link, [built]))[0]
        finally:
            self._links.append(link)

    def add_built_many(self, built: Sequence[BuiltJob], *,
                       meanwhile: Callable[[list[BuiltJob]], None] | None = None) -> list[Enqueued]:
        """Send jobs returned by ``build``, one round trip per chunk of ``chunk_size``.

        ``meanwhile(chunk)`` is called with each chunk once it is on its way
        and before its reply is read, so work that does not wait for the
        reply (the Django backend making its TaskResults) is done while the
        server runs the chunk instead of before sending it. Should it raise,
        the chunk in flight is still seen through (its jobs are added) and the
        error is raised; later chunks are not sent.
        """
        size = self.chunk_size
        return self._write_chunks((list(built[start:start + size]) for start in range(0, len(built), size)),
                                  meanwhile)

    def add_encoded(self, items: Sequence[tuple[str, str, bytes]]) -> list[Enqueued]:
        """Add jobs encoded earlier by ``build``: (job id, when, payload) triples.

        The job id doubles as the idempotency key, so sending the same job
        twice (a relay retrying after a lost reply) adds it once.
        """
        size = self.chunk_size
        return self._write_chunks(
            [BuiltJob(job_id, when, payload, job_id) for job_id, when, payload in items[start:start + size]]
            for start in range(0, len(items), size))

    def add_bulk(self, jobs: Iterable[JobSpec]) -> list[Enqueued]:
        """Add many jobs, one round trip per chunk of ``chunk_size``.

        Every job of a chunk is validated before the chunk is sent, so a bad job
        raises before any job of its chunk reaches Redis (earlier chunks are
        added).
        """
        return self._write_chunks(self._chunks(jobs))

    # --- asyncio API ------------------------------------------------------------

    def _async(self) -> tuple[aredis.Redis, Scripts]:
        # asyncio connections belong to the loop that opened them
        loop = asyncio.get_running_loop()
        if self._aredis is None or self._aloop is not loop:
            # retries are ours (guarded by the lane), not redis-py's
            self._aredis = aconnect(self._url or url_of(self.redis), cluster=self._cluster,
                                    retry=AsyncRetry(NoBackoff(), 0))
            self._ascripts = Scripts(self._aredis)
            self._aloop = loop
        return self._aredis, self._ascripts  # type: ignore[return-value]

    async def _awrite(self, client: aredis.Redis, scripts: Scripts, lane: Lane, chunk: list[Any]) -> list[Enqueued]:
        k = self.keys
        keys = [k.stream, k.delayed, k.lane + lane.lane]
        args = [k.unique, self.unique_ttl_ms, k.metrics, wire.LANE_TTL_MS, lane.next_seq(), "", wire.items(chunk)]
        deadline = _monotonic() + self.retry_for  # the window opens with the write, not with its first failure
        retrier: Retrier | None = None
        while True:
            try:
                if not self._registered:
                    await client.sadd(QUEUES_REGISTRY, self.name)
                    self._registered = True
                left = deadline - _monotonic()
                call = scripts.enqueue(keys=keys, args=args)
                # no try outlasts the window (a silent server would hold it for the socket's whole timeout)
                reply = await (asyncio.wait_for(call, max(left, 0.001)) if self.retry_for else call)
                return self._results(chunk, reply)
            except Exception as exc:
                if not unavailable(exc):  # a try cut short by the window is a TimeoutError: an OSError
                    raise
                args[5] = "1"  # sent again: the script reads the lane first
                retrier = retrier or Retrier(self.retry_for, deadline)
                wait = retrier.pause(exc, sent=True)
                if wait is None:
                    raise self._unavailable(exc, retrier, chunk, server_of(client)) from exc
                await asyncio.sleep(wait)

    async def aadd(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Enqueued:
        return (await self.aadd_bulk([JobSpec(task, args, kwargs or {}, **options)]))[0]

    async def aadd_bulk(self, jobs: Iterable[JobSpec]) -> list[Enqueued]:
        return await self._asend(self._chunks(jobs))

    async def aadd_built_many(self, built: Sequence[BuiltJob]) -> list[Enqueued]:
        """Send jobs returned by ``build`` from async code, one round trip per chunk."""
        size = self.chunk_size
        return await self._asend(list(built[start:start + size]) for start in range(0, len(built), size))

    async def _asend(self, chunks: Iterable[list[Any]]) -> list[Enqueued]:
        if self._owned_undetected:  # the server did not answer when this queue was made: is it a cluster?
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                cluster = await ais_cluster(self._url or "")
                self.close()
                self._use(connect(self._url, cluster=cluster))
                self._aredis = None
        client, scripts = self._async()
        out: list[Enqueued] = []
        lane = self._alanes.pop() if self._alanes else Lane()  # one lane per concurrent caller
        try:
            for chunk in chunks:  # each validated before anything of it is written
                out += await self._awrite(client, scripts, lane, chunk)
        except EnqueueUnavailable as exc:
            exc.added = out
            raise
        finally:
            self._alanes.append(lane)
        return out

    async def aclose(self) -> None:
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None
