"""The worker: reads jobs from queues and runs their handlers.

One asyncio loop per process. Per queue, a reader pulls batches with
XREADGROUP (COUNT, BLOCK) into an in-memory inbox; jobs leave the inbox to
run, up to ``concurrency`` at once (async handlers each in a task of its own on
the loop, sync handlers in a thread pool); outcomes go to the settler, which tells Redis in batches.
Beside them run the promoter of each queue and a housekeeping loop
(heartbeat, pause flag, lease renewal, crash recovery).

Shutdown (SIGTERM/SIGINT or ``request_stop``): stop reading, put fetched but
unstarted jobs back on the stream, let running jobs finish up to a deadline,
settle everything, release the promoter lock, exit.

A worker can also stop itself after ``max_jobs`` jobs or once its memory
passes ``max_memory_mb``, the same graceful way, and says why in
``recycle_reason``: a supervisor (chasqui_core/supervisor.py) then starts a
fresh process in its place, which is how a slow leak in task code is kept in
check without anyone watching.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError

from .connection import DEFAULT_URL, aconnect, ais_cluster, is_cluster_client, node_url
from .envelope import DecodeError, check_json_types, decode, now_ms
from .idempotency import IDEMPOTENCY_KEY, completed_by, key_of
from .keys import GROUP, QUEUES_REGISTRY, QueueKeys
from .promoter import Promoter
from .queue import DEFAULT_MAX_PAYLOAD_BYTES
from .recovery import PANIC_AFTER_DEATHS, Leases, forget_dead_workers, reclaim_abandoned
from .registry import HandlerRegistry
from .retry import RetryPolicy, budget
from .scheduler import Fire, Scheduler, queue_fire
from .schedules import Schedule
from .scripts import Scripts
from .signing import Signer
from .outcomes import Delivery, Outcomes
from .settler import Settler
from .sync_lane import FAILED, REQUEUE, SyncLane
from .tracebacks import class_path, message
import contextlib

logger = logging.getLogger("chasqui.worker")

CURRENT_JOBS_SHOWN = 20
"""How many running jobs a heartbeat lists (the oldest first): enough to spot a stuck one."""


def resident_kb() -> int:
    """This process's resident memory now, in KiB (0 where the system does not say)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(slots=True)
class WorkerStats:
    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    started_at: float = field(default_factory=time.time)


class Worker:
    def __init__(
        self,
        queues: list[str],
        registry: HandlerRegistry,
        *,
        url: str | None = None,
        concurrency: int = 10,
        batch_size: int = 100,
        block_ms: int = 1000,
        policy: RetryPolicy | None = None,
        visibility_timeout_ms: int = 30_000,
        promoter_poll_interval: float = 0.1,
        promoter_lock_ttl_ms: int = 5000,
        heartbeat_interval: float = 2.0,
        shutdown_timeout: float = 25.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        flush_interval: float = 0.002,
        install_signal_handlers: bool = True,
        worker_id: str | None = None,
        dead_worker_grace_ms: int = 600_000,
        max_jobs: int | None = None,
        max_memory_mb: int | None = None,
        supervisor_pid: int | None = None,
        schedules: Sequence[Schedule] = (),
        fire: Fire | None = None,
        signing_keys: Sequence[bytes | str] = (),
    ) -> None:
        if not queues:
            raise ValueError("A worker needs at least one queue")
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
        self.keys = [QueueKeys.for_queue(q) for q in dict.fromkeys(queues)]
        self.registry = registry
        self.url = url
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.policy = policy or RetryPolicy()
        self.visibility_timeout_ms = visibility_timeout_ms
        self.promoter_poll_interval = promoter_poll_interval
        self.promoter_lock_ttl_ms = promoter_lock_ttl_ms
        self.heartbeat_interval = heartbeat_interval
        self.shutdown_timeout = shutdown_timeout
        self.max_payload_bytes = max_payload_bytes
        self.flush_interval = flush_interval
        self.install_signal_handlers = install_signal_handlers
        self.dead_worker_grace_ms = dead_worker_grace_ms
        """Workers silent this long leave the consumer group and the workers list (once they hold nothing)."""
        for name, limit in (("max_jobs", max_jobs), ("max_memory_mb", max_memory_mb)):
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be 1 or more, got {limit}")
        self.max_jobs = max_jobs
        self.max_memory_mb = max_memory_mb
        self.supervisor_pid = supervisor_pid
        """The pid of the supervisor that started this process, shown with its heartbeat; None when standalone."""
        self.signer = Signer(signing_keys) if signing_keys else None
        self._signing_keys = list(signing_keys)
        """With signing keys, only jobs signed with one of them run; the others are dead-lettered as
        ``bad_signature`` before their task is looked up (see signing.py)."""
        self.recycle_reason = ""
        """Why the worker stopped itself (``max_jobs`` or ``max_memory_mb`` reached); "" when it did not."""
        self.schedules = list(schedules)
        """Schedules this worker fires while it leads the scheduler (every worker may; one leads)."""
        self.fire = fire
        """Adds a fire's job; None adds it with an engine Queue (the Django integration passes its own)."""
        self.hostname = socket.gethostname()
        self.id = worker_id or f"{self.hostname}:{os.getpid()}:{os.urandom(3).hex()}"
        self.stats = WorkerStats()
        self.prefetch = max(batch_size, concurrency * 2)
        self.unfinished_sync_jobs = 0
        """Sync jobs still running in threads when run() returned (they cannot be cancelled)."""
        self.problem = ""
        """What went wrong inside the worker itself, if anything (shown with its heartbeat)."""
        self._stop = asyncio.Event()  # made anew by each run()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: dict[str, bool] = {k.queue: False for k in self.keys}

    # --- public -------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Jobs running now, on the loop and in the sync threads."""
        lane = getattr(self, "_lane", None)
        return getattr(self, "_running", 0) + (lane.outstanding if lane is not None else 0)

    @property
    def buffered(self) -> int:
        """Jobs fetched and not yet finished: what counts against the prefetch."""
        lane = self._lane
        return len(self._inbox) + self._running + (lane.outstanding if lane is not None else 0)

    def request_stop(self) -> None:
        """Ask the worker to stop; safe to call from a signal handler or another thread."""
        loop, stop = self._loop, self._stop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            stop.set()
        else:
            loop.call_soon_threadsafe(stop.set)

    def run_sync(self) -> None:
        asyncio.run(self.run())

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await ais_cluster(self.url or DEFAULT_URL)  # asked once, without blocking the loop
        self.client = aconnect(self.url, health_check_interval=30)
        self.cluster = is_cluster_client(self.client)
        """A Redis Cluster client: each queue is read on a connection to the master serving its slot."""
        self.scripts = Scripts(self.client)
        self.settler = Settler(self.client, self.scripts, flush_size=max(100, self.batch_size),
                               flush_interval=self.flush_interval, on_retry_scheduled=self._on_retry_scheduled)
        self.outcomes = Outcomes(self.settler, self.policy, self.id)
        self.promoters = {
            k.queue: Promoter(self.client, self.scripts, k, self.id, poll_interval=self.promoter_poll_interval,
                              lock_ttl_ms=self.promoter_lock_ttl_ms)
            for k in self.keys
        }
        self._inbox: deque[Delivery] = deque()
        self._jobs: set[asyncio.Task[None]] = set()
        """Tasks of the jobs waiting on something now (see ``_dispatch``); a job that never waits is never kept."""
        self._context = contextvars.copy_context()
        """What each job's context starts as: the worker's own, copied per job."""
        self._room = asyncio.Event()
        self._room.set()
        self._leases = Leases(self.scripts, self.id, self.visibility_timeout_ms)
        self._held = self._leases.held
        self._running = 0
        self._running_jobs: dict[bytes, tuple[str, str, int]] = {}
        """Entry id -> (task, job id, started at ms) of each job running now, for the heartbeat."""
        self._lane: SyncLane | None = None  # started on the first sync job
        self._reader_ids: dict[str, tuple[int, Any]] = {}
        """Queue -> (client id of its reader's connection, the cluster node it is on or None)."""

        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop.set)

        await self._setup()
        logger.info("worker %s started on %s (concurrency %d)", self.id,
                    ", ".join(k.queue for k in self.keys), self.concurrency)
        settler_task = asyncio.create_task(self.settler.run(self._stop), name="settler")
        readers = [asyncio.create_task(self._read_loop(k), name=f"reader:{k.queue}") for k in self.keys]
        promoters = [asyncio.create_task(p.run(self._stop), name=f"promoter:{q}") for q, p in self.promoters.items()]
        self.scheduler = None
        if self.schedules:
            fire = self.fire or queue_fire(self.url, self._signing_keys[0] if self._signing_keys else None)
            self.scheduler = Scheduler(self.client, self.scripts, self.schedules, fire, self.id,
                                       lock_ttl_ms=self.promoter_lock_ttl_ms)
            promoters.append(asyncio.create_task(self.scheduler.run(self._stop), name="scheduler"))
        housekeeping = asyncio.create_task(self._housekeeping(), name="housekeeping")
        try:
            await self._stop.wait()
        finally:
            logger.info("worker %s stopping", self.id)
            await self._unblock_readers(readers)
            await asyncio.gather(*readers, return_exceptions=True)
            # jobs fetched but never started go back to the stream, as they were
            unstarted = list(self._inbox)
            self._inbox.clear()
            if self._lane is not None:
                self._lane.stopping = True
                unstarted += self._lane.take_unstarted()
            for d in unstarted:
                self._requeue(d)
            deadline = time.monotonic() + self.shutdown_timeout
            while self.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if self.in_flight:
                logger.warning("worker %s: %d jobs still running after %.0fs; they stay pending and will be "
                               "reclaimed by another worker", self.id, self.in_flight, self.shutdown_timeout)
            jobs = list(self._jobs)
            for task in jobs:
                task.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            if self._lane is not None:
                self.unfinished_sync_jobs = self._lane.outstanding
                self._lane.close()
            housekeeping.cancel()
            await asyncio.gather(housekeeping, return_exceptions=True)
            await self.settler.flush()
            await asyncio.gather(settler_task, *promoters, return_exceptions=True)
            await self._unregister()
            await self.client.aclose()
            logger.info("worker %s stopped (%d processed)", self.id, self.stats.processed)

    # --- set-up ---------------------------------------------------------------

    async def _setup(self) -> None:
        for k in self.keys:
            try:
                await self.client.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        await self.client.sadd(QUEUES_REGISTRY, *[k.queue for k in self.keys])
        await self._heartbeat()

    def _on_retry_scheduled(self, queue: str, due_ms: int, server_ms: int) -> None:
        promoter = self.promoters.get(queue)
        if promoter is not None:
            promoter.hint(due_ms, server_ms)

    # --- reading ----------------------------------------------------------------

    async def _read_loop(self, keys: QueueKeys) -> None:
        """Fetch batches for one queue on a connection of its own.

        The connection is the reader's alone, so shutdown can cut its BLOCK
        short with CLIENT UNBLOCK, and the XREADGROUP command is packed once
        per batch size and its raw reply read without redis-py's reply
        reshaping: this runs once per batch on the hot path. On a cluster the
        connection goes to the master serving the queue's slot; after a
        failover or a resharding (``MOVED``, or a node that stopped
        answering) the reader reads the cluster's layout again and follows.
        """
        reader: Any = None
        node: Any = None
        packed: dict[int, Any] = {}
        try:
            while not self._stop.is_set():
                if self._paused[keys.queue]:
                    await self._sleep_unless_stopped(0.5)
                    continue
                room = self.prefetch - self.buffered
                if room < min(self.batch_size, self.prefetch) // 2 + 1:
                    self._room.clear()
                    await self._wait_room()
                    continue
                count = min(self.batch_size, room)
                try:
                    if reader is None:
                        reader, node = await self._open_reader(keys)
                    conn = reader.connection
                    if conn is None or keys.queue not in self._reader_ids:
                        self._reader_ids[keys.queue] = (await reader.client_id(), node)
                        conn = reader.connection
                        packed.clear()
                    assert conn is not None  # client_id() above connected it
                    command = packed.get(count)
                    if command is None:
                        command = packed[count] = conn.pack_command(
                            "XREADGROUP", "GROUP", GROUP, self.id, "COUNT", count, "BLOCK", self.block_ms,
                            "STREAMS", keys.stream, ">")
                    await conn.send_packed_command(command, check_health=False)
                    reply = await conn.read_response()
                except ResponseError as exc:
                    if "NOGROUP" in str(exc):  # the stream was deleted under us: recreate it
                        await self._setup()
                        continue
                    if self.cluster and isinstance(exc, (AskError, ClusterDownError, TryAgainError)):  # MOVED is an ASK
                        logger.info("reading %s: %s; following the cluster's new layout", keys.queue, exc)
                        await self._drop_reader(keys, reader, refresh=True)
                        reader = None
                        await self._sleep_unless_stopped(0.1)
                        continue
                    raise
                except Exception as exc:
                    if isinstance(exc, (ConnectionError, OSError)) or "Connection" in type(exc).__name__ \
                            or "Timeout" in type(exc).__name__:
                        logger.warning("reading %s failed (%s); retrying", keys.queue, exc)
                        await self._drop_reader(keys, reader, refresh=self.cluster)
                        reader = None
                        await self._sleep_unless_stopped(1.0)
                        continue
                    raise
                if reply:
                    # a map of stream -> entries under RESP3, a list of pairs under RESP2
                    for entries in reply.values() if type(reply) is dict else (pair[1] for pair in reply):
                        keyed = self._accept(keys, entries, 1)
                        if keyed:
                            await self._screen(keys, keyed)
        finally:
            self._reader_ids.pop(keys.queue, None)
            if reader is not None:
                await reader.aclose()

    async def _open_reader(self, keys: QueueKeys) -> tuple[Any, Any]:
        """A single-connection client for one queue's reader, and the cluster node it talks to (None off a cluster)."""
        if not self.cluster:
            return aconnect(self.url, cluster=False, single_connection_client=True), None
        await self.client.initialize()
        node = self.client.get_node_from_key(keys.stream)
        return aconnect(node_url(self.client.chasqui_url, node.host, node.port), cluster=False,
                        single_connection_client=True), node

    async def _drop_reader(self, keys: QueueKeys, reader: Any, *, refresh: bool) -> None:
        """Close a reader that failed; on a cluster, read the layout again so the next one finds the slot's master."""
        self._reader_ids.pop(keys.queue, None)
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.aclose()
        if refresh:
            with contextlib.suppress(Exception):
                await self.client.nodes_manager.initialize()

    async def _unblock_readers(self, readers: list[asyncio.Task[None]]) -> None:
        """Wake readers blocked in XREADGROUP so shutdown does not wait out BLOCK."""
        while not all(r.done() for r in readers):
            for client_id, node in list(self._reader_ids.values()):
                with contextlib.suppress(Exception):
                    if node is None:
                        await self.client.client_unblock(client_id)
                    else:
                        await self.client.client_unblock(client_id, target_nodes=node)
            await asyncio.wait(readers, timeout=0.05)

    async def _wait_room(self) -> None:
        waiter = asyncio.ensure_future(self._room.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    def _accept(self, keys: QueueKeys, entries: list[Any], deliveries: int) -> list[Delivery] | None:
        """Decode fetched entries; refuse the ones no handler may run, and start the others.

        Refused: what cannot be decoded, a job without a valid signature when
        the worker has signing keys (checked before its task is looked up),
        a poison pill, an unknown task. Jobs carrying an idempotency key are
        returned instead of run, for the caller to screen all of them with
        one round trip (``_screen``); a batch without any costs nothing more.
        """
        now = time.monotonic()
        accepted = 0
        held = self._held
        signer = self.signer
        keyed: list[Delivery] | None = None
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                continue
            if entry_id in held:
                continue  # already ours: a lease that lapsed while this worker still held the entry
            if type(fields) is list:  # raw reply: [field, value, ...]
                payload = fields[1] if len(fields) == 2 and fields[0] == b"j" else None
                if payload is None:
                    fields = dict(zip(fields[::2], fields[1::2], strict=False))
                    payload = fields.get(b"j")
            else:
                payload = fields.get(b"j")
            refuse = self.outcomes.refuse
            if payload is None:
                self.outcomes.refuse_foreign(keys, entry_id, fields)
                continue
            if len(payload) > self.max_payload_bytes:
                refuse(keys, entry_id, payload, "oversize", "PayloadTooLarge",
                       f"payload is {len(payload)} bytes; this worker accepts at most {self.max_payload_bytes}")
                continue
            try:
                job = decode(payload)
            except DecodeError as exc:
                refuse(keys, entry_id, payload, "decode_failed", "DecodeError", str(exc))
                continue
            if signer is not None and not signer.verify(job):
                self.outcomes.bad_signature(keys, entry_id, payload, job, signer.refusal(job))
                continue
            if deliveries > 1 and job.deaths + deliveries - 1 >= PANIC_AFTER_DEATHS:
                refuse(keys, entry_id, payload, "panic", "WorkerLost",
                       f"the job was running when its worker died {job.deaths + deliveries - 1} times", job)
                continue
            handler = self.registry.get(job.task)
            if handler is None:
                refuse(keys, entry_id, payload, "unknown_task", "UnknownTask",
                       f"no task named {job.task!r} is registered in this worker", job)
                continue
            marker = None
            if IDEMPOTENCY_KEY in job.meta:
                try:
                    marker = key_of(job)
                except DecodeError as exc:
                    refuse(keys, entry_id, payload, "decode_failed", "DecodeError", str(exc), job)
                    continue
            held[entry_id] = (keys, now)
            delivery = Delivery(keys, entry_id, payload, job, handler, deliveries,
                                budget(job, handler, self.policy), marker)
            if marker is not None:
                if keyed is None:
                    keyed = []
                keyed.append(delivery)
            elif handler.is_async:
                self._inbox.append(delivery)
                accepted += 1
            else:
                if self._lane is None:
                    self._lane = SyncLane(self.concurrency, self.id, self._on_sync_outcomes, self._running_jobs)
                self._lane.submit(delivery)
        if accepted:
            self._dispatch()
        return keyed

    async def _accept_screened(self, keys: QueueKeys, entries: list[Any], deliveries: int) -> None:
        """``_accept``, then ``_screen`` what it returned (for entries reclaimed from dead workers)."""
        keyed = self._accept(keys, entries, deliveries)
        if keyed:
            await self._screen(keys, keyed)

    async def _screen(self, keys: QueueKeys, keyed: list[Delivery]) -> None:
        """Run the keyed jobs whose key has not completed; acknowledge the others without running them.

        One MGET for the batch's markers. If Redis cannot answer, the jobs go
        back on the stream as they were (nothing runs unchecked, nothing is lost).
        """
        try:
            done = await completed_by(self.client, [keys.done + (d.idempotency_key or "") for d in keyed])
        except asyncio.CancelledError:
            for d in keyed:
                self._requeue(d)
            raise
        except Exception as exc:
            logger.warning("checking the idempotency keys of %d job(s) on %s failed (%s: %s); they go back on "
                           "the stream", len(keyed), keys.queue, type(exc).__name__, exc)
            for d in keyed:
                self._requeue(d)
            return
        accepted = False
        for d, by in zip(keyed, done, strict=True):
            if by is not None:
                self._held.pop(d.entry_id, None)
                try:
                    self.outcomes.skipped(d, by)
                except Exception as exc:  # whatever goes wrong touches this job only
                    self.outcomes.internal(d, "acknowledging a job whose idempotency key had completed", exc)
            elif self._stop.is_set():  # stopping while the markers were read: it must not start now
                self._requeue(d)
            elif d.handler.is_async:
                self._inbox.append(d)
                accepted = True
            else:
                if self._lane is None:
                    self._lane = SyncLane(self.concurrency, self.id, self._on_sync_outcomes, self._running_jobs)
                self._lane.submit(d)
        if accepted:
            self._dispatch()

    # --- running ------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start waiting jobs, up to ``concurrency`` running at once, each as a task of its own.

        A job's task starts eagerly: it runs in this call until the handler
        first waits on something, so a job that never waits finishes here,
        without a trip through the event loop (parked slot coroutines, woken
        per batch, cost a quarter of a retried job's CPU when retries came
        back in small batches). A job that does wait goes on as an ordinary
        task, and the next job starts when it ends. Each job runs in its own
        copy of the worker's context: a context variable a task sets (an
        activated language, a logging field) ends with that job.
        """
        inbox = self._inbox
        base = self._context
        while inbox and self._running < self.concurrency and not self._stop.is_set():
            delivery = inbox.popleft()
            self._running += 1
            if self.buffered <= self.prefetch // 2:
                self._room.set()
            run = asyncio.Task(self._run_job(delivery), loop=self._loop, context=base.copy(), eager_start=True)
            if run.done():  # the job finished inside this call
                self._job_ended(run, dispatch=False)
            else:
                self._jobs.add(run)
                run.add_done_callback(self._job_ended)

    async def _run_job(self, delivery: Delivery) -> None:
        try:
            await self._execute(delivery)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # _execute is total; this is the last line of defence
            self._internal(delivery, "running the job", exc)
        finally:
            self._running -= 1

    def _job_ended(self, run: asyncio.Task[None], dispatch: bool = True) -> None:
        """Start the next waiting job; a job task that died of the worker's own error is logged and reported."""
        self._jobs.discard(run)
        if not run.cancelled():
            exc = run.exception()
            if exc is not None:
                self.problem = f"a job's task died ({class_path(exc)}: {message(exc)})"
                logger.error("worker %s: %s", self.id, self.problem, exc_info=exc)
        if dispatch:
            self._dispatch()

    async def _execute(self, d: Delivery) -> None:
        job, handler = d.job, d.handler
        started = now_ms()
        running = self._running_jobs
        running[d.entry_id] = (job.task, job.id, started)
        t0 = time.perf_counter()
        try:
            result = await handler.fn(*d.handler_args(self.id), **job.kwargs)
            if job.result_ttl:
                check_json_types(result, "return value")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a handler fail its job, not the worker
            running.pop(d.entry_id, None)
            self._outcome(d, exc, started, int((time.perf_counter() - t0) * 1000), failed=True)
            return
        running.pop(d.entry_id, None)
        self._outcome(d, result, started, int((time.perf_counter() - t0) * 1000), failed=False)

    def _outcome(self, d: Delivery, value: Any, started: int, duration: int, *, failed: bool) -> None:
        """Hand a finished run to the outcomes; whatever goes wrong there touches this job only."""
        self._held.pop(d.entry_id, None)
        self.stats.processed += 1
        if self.stats.processed == self.max_jobs:
            self._recycle(f"{self.max_jobs} jobs processed (max_jobs {self.max_jobs})")
        try:
            if failed:
                self.stats.failed += 1
                self.outcomes.failed(d, value, started, duration)
            else:
                self.stats.succeeded += 1
                self.outcomes.succeeded(d, value, started, duration)
        except Exception as exc:
            self.outcomes.internal(d, "recording the outcome", exc)

    def _internal(self, d: Delivery, doing: str, exc: BaseException) -> None:
        self._held.pop(d.entry_id, None)
        self.outcomes.internal(d, doing, exc)

    def _requeue(self, d: Delivery) -> None:
        self._held.pop(d.entry_id, None)
        self.outcomes.requeue(d)

    def _on_sync_outcomes(self, outcomes: list[Any]) -> None:
        for kind, d, value, started, duration in outcomes:
            if kind == REQUEUE:
                try:
                    self._requeue(d)
                except Exception as exc:
                    self._internal(d, "putting the job back", exc)
            else:
                self._outcome(d, value, started, duration, failed=kind == FAILED)
        if self.buffered <= self.prefetch // 2:
            self._room.set()

    # --- recycling --------------------------------------------------------------------

    def _recycle(self, reason: str) -> None:
        """Stop gracefully because a limit was reached: running jobs finish, the rest go back to the stream."""
        if self.recycle_reason or self._stop.is_set():
            return
        self.recycle_reason = reason
        logger.info("worker %s recycling: %s", self.id, reason)
        self._stop.set()

    def _check_memory(self) -> None:
        if self.max_memory_mb is None:
            return
        rss_mb = resident_kb() // 1024
        if rss_mb >= self.max_memory_mb:
            self._recycle(f"memory at {rss_mb} MB (max_memory_mb {self.max_memory_mb})")

    # --- housekeeping -----------------------------------------------------------------

    async def _housekeeping(self) -> None:
        last_heartbeat = last_reclaim = last_forget = 0.0
        lease_every = max(0.05, self.visibility_timeout_ms / 3000)
        reclaim_every = max(0.05, min(self.visibility_timeout_ms / 2000, 15.0))
        forget_every = max(0.5, min(self.dead_worker_grace_ms / 4000, 60.0))
        while True:
            now = time.monotonic()
            try:
                await self._leases.renew(now)
                if now - last_heartbeat >= self.heartbeat_interval:
                    await self._heartbeat()
                    self._check_memory()
                    last_heartbeat = now
                if now - last_reclaim >= reclaim_every:
                    await self._reclaim()
                    last_reclaim = now
                if now - last_forget >= forget_every:
                    await self._forget_dead_workers()
                    last_forget = now
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("housekeeping: %s", exc)
            self.outcomes.summarise_logs()
            await asyncio.sleep(min(lease_every, reclaim_every, self.heartbeat_interval))

    async def _reclaim(self) -> None:
        for keys in self.keys:
            if not self._paused[keys.queue]:
                await reclaim_abandoned(self.scripts, keys, self.id, min_idle_ms=self.visibility_timeout_ms,
                                        room=lambda: self.prefetch - self.buffered, accept=self._accept_screened)

    async def _forget_dead_workers(self) -> None:
        for keys in self.keys:
            for name in await forget_dead_workers(self.client, keys, self.id, grace_ms=self.dead_worker_grace_ms):
                logger.info("removed worker %s from %s: silent for over %d s and holding no jobs", name, keys.queue,
                            self.dead_worker_grace_ms // 1000)

    async def _heartbeat(self) -> None:
        info = msgpack.packb({
            "id": self.id, "host": self.hostname, "pid": os.getpid(), "queues": [k.queue for k in self.keys],
            "concurrency": self.concurrency, "in_flight": self.in_flight,
            "processed": self.stats.processed, "failed": self.stats.failed,
            "started_at": int(self.stats.started_at * 1000), "last_seen": now_ms(),
            "problem": self.problem, "rss_kb": resident_kb(), "current": self._current_jobs(),
            "supervisor": self.supervisor_pid,
        })
        pipe = self.client.pipeline(transaction=False)
        for k in self.keys:
            pipe.hset(k.workers, self.id, info)
            pipe.exists(k.paused)
        replies = await pipe.execute()
        for k, paused in zip(self.keys, replies[1::2], strict=False):
            if self._paused[k.queue] and not paused:
                logger.info("queue %s resumed", k.queue)
            elif paused and not self._paused[k.queue]:
                logger.info("queue %s is paused: not reading from it", k.queue)
            self._paused[k.queue] = bool(paused)

    def _current_jobs(self) -> list[list[Any]]:
        """The longest-running jobs (task, job id, started at ms), at most CURRENT_JOBS_SHOWN of them."""
        running = list(self._running_jobs.values())  # a copy: sync threads add and remove meanwhile
        running.sort(key=lambda job: job[2])
        return [list(job) for job in running[:CURRENT_JOBS_SHOWN]]

    async def _unregister(self) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in self.keys:
                pipe.hdel(k.workers, self.id)
            await pipe.execute()
        except Exception:
            pass

