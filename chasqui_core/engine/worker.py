"""The worker: reads jobs from queues and runs their handlers.

One asyncio loop per process. Per queue, a reader pulls batches with
XREADGROUP (COUNT, BLOCK) into an in-memory inbox; ``concurrency`` slots take
jobs from the inbox and run them (async handlers on the loop, sync handlers in
a thread pool); outcomes go to the settler, which tells Redis in batches.
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
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from .connection import aconnect
from .envelope import DecodeError, Job, check_json_types, decode, error_record, now_ms
from .keys import GROUP, QUEUES_REGISTRY, QueueKeys
from .log_budget import LogBudget
from .promoter import Promoter
from .queue import DEFAULT_MAX_PAYLOAD_BYTES
from .recovery import PANIC_AFTER_DEATHS, extend_leases, forget_dead_workers, reclaim
from .registry import Handler, HandlerRegistry, JobContext
from .results import encode_result
from .retry import RetryPolicy, budget, decide
from .scripts import Scripts
from .settler import Settler
from .sync_lane import FAILED, REQUEUE, SyncLane
from .tracebacks import class_path, format_exception

logger = logging.getLogger("chasqui.worker")


@dataclass(slots=True)
class Delivery:
    keys: QueueKeys
    entry_id: bytes
    payload: bytes
    job: Job
    handler: Handler
    deliveries: int = 1
    max_attempts: int = 0
    """The job's budget of runs (see retry.budget), for the JobContext."""

    def handler_args(self, worker_id: str) -> tuple | list:
        """Positional arguments for the handler: a JobContext first when it asked for one."""
        if self.handler.takes_context:
            ctx = JobContext(self.job, self.keys.queue, worker_id, self.entry_id.decode(), self.deliveries,
                             self.max_attempts)
            return (ctx, *self.job.args)
        return self.job.args


@dataclass(slots=True)
class WorkerStats:
    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    started_at: float = field(default_factory=time.time)


def _message(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception cannot print itself.

    An exception class whose ``__str__`` raises (formatting an attribute of
    None, say) is a bug in the error, not a reason to lose the job's retries.
    """
    try:
        return printable(str(exc))
    except Exception as failure:
        return f"<{class_path(exc)}: str() raised {class_path(failure)}>"


def printable(text: str) -> str:
    """``text`` safe to encode: lone surrogates (undecodable bytes smuggled into a str) escaped.

    Such a message would make msgpack refuse the whole envelope or batch.
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def resident_memory_mb() -> int:
    """This process's resident memory now, in MB.

    Linux tells the current figure (/proc/self/statm); elsewhere the peak
    (getrusage) stands in, which only ever errs towards recycling sooner.
    """
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
        return peak // (1024 * 1024) if sys.platform == "darwin" else peak // 1024


def _result_blob(job: Job, status: str, *, started: int, finished: int, worker: str,
                 return_value: Any = None) -> bytes:
    return encode_result(job_id=job.id, task=job.task, status=status, args=job.args, kwargs=job.kwargs,
                         enqueued_at=job.created_at, errors=job.errors, started_at=started, finished_at=finished,
                         worker=worker, return_value=return_value)


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
        self.recycle_reason = ""
        """Why the worker stopped itself (``max_jobs`` or ``max_memory_mb`` reached); "" when it did not."""
        self.hostname = socket.gethostname()
        self.id = worker_id or f"{self.hostname}:{os.getpid()}:{os.urandom(3).hex()}"
        self.stats = WorkerStats()
        self.prefetch = max(batch_size, concurrency * 2)
        self.unfinished_sync_jobs = 0
        """Sync jobs still running in threads when run() returned (they cannot be cancelled)."""
        self.problem = ""
        """What went wrong inside the worker itself, if anything (shown with its heartbeat)."""
        self._retry_lines = LogBudget(logger, "jobs failed and were scheduled for a retry")
        self._dead_lines = LogBudget(logger, "jobs failed for good and went to the dead-letter queue")
        self._stop: asyncio.Event | None = None  # created on the loop in run()
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
        if loop is None or stop is None:
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
        self.client = aconnect(self.url, health_check_interval=30)
        self.scripts = Scripts(self.client)
        self.settler = Settler(self.client, self.scripts, flush_size=max(100, self.batch_size),
                               flush_interval=self.flush_interval, on_retry_scheduled=self._on_retry_scheduled)
        self.promoters = {
            k.queue: Promoter(self.client, self.scripts, k, self.id, poll_interval=self.promoter_poll_interval,
                              lock_ttl_ms=self.promoter_lock_ttl_ms)
            for k in self.keys
        }
        self._inbox: deque[Delivery] = deque()
        self._inbox_ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._held: dict[bytes, tuple[QueueKeys, float]] = {}
        self._running = 0
        self._lane: SyncLane | None = None  # started on the first sync job
        self._reader_ids: dict[str, int] = {}

        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop.set)

        await self._setup()
        logger.info("worker %s started on %s (concurrency %d)", self.id,
                    ", ".join(k.queue for k in self.keys), self.concurrency)
        settler_task = asyncio.create_task(self.settler.run(self._stop), name="settler")
        readers = [asyncio.create_task(self._read_loop(k), name=f"reader:{k.queue}") for k in self.keys]
        slots = [self._start_slot(i) for i in range(self.concurrency)]
        self._slots = slots
        promoters = [asyncio.create_task(p.run(self._stop), name=f"promoter:{q}") for q, p in self.promoters.items()]
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
            for _ in self._slots:
                self._inbox.append(None)  # type: ignore[arg-type]
            self._inbox_ready.set()
            deadline = time.monotonic() + self.shutdown_timeout
            while self.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if self.in_flight:
                logger.warning("worker %s: %d jobs still running after %.0fs; they stay pending and will be "
                               "reclaimed by another worker", self.id, self.in_flight, self.shutdown_timeout)
            for task in self._slots:
                task.cancel()
            await asyncio.gather(*self._slots, return_exceptions=True)
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
        reshaping: this runs once per batch on the hot path.
        """
        reader = aconnect(self.url, single_connection_client=True)
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
                    conn = reader.connection
                    if conn is None or keys.queue not in self._reader_ids:
                        self._reader_ids[keys.queue] = await reader.client_id()
                        conn = reader.connection
                        packed.clear()
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
                    raise
                except Exception as exc:
                    if isinstance(exc, (ConnectionError, OSError)) or "Connection" in type(exc).__name__ \
                            or "Timeout" in type(exc).__name__:
                        logger.warning("reading %s failed (%s); retrying", keys.queue, exc)
                        self._reader_ids.pop(keys.queue, None)
                        await reader.connection.disconnect() if reader.connection else None
                        await self._sleep_unless_stopped(1.0)
                        continue
                    raise
                if reply:
                    # a map of stream -> entries under RESP3, a list of pairs under RESP2
                    for entries in reply.values() if type(reply) is dict else (pair[1] for pair in reply):
                        self._accept(keys, entries, 1)
        finally:
            self._reader_ids.pop(keys.queue, None)
            await reader.aclose()

    async def _unblock_readers(self, readers: list[asyncio.Task]) -> None:
        """Wake readers blocked in XREADGROUP so shutdown does not wait out BLOCK."""
        while not all(r.done() for r in readers):
            for client_id in list(self._reader_ids.values()):
                try:
                    await self.client.client_unblock(client_id)
                except Exception:
                    pass
            await asyncio.wait(readers, timeout=0.05)

    async def _wait_room(self) -> None:
        waiter = asyncio.ensure_future(self._room.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        except TimeoutError:
            pass

    def _accept(self, keys: QueueKeys, entries, deliveries: int) -> None:
        """Decode fetched entries; refuse the ones no handler may run."""
        now = time.monotonic()
        accepted = 0
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                continue
            if entry_id in self._held:
                continue  # already ours: a lease that lapsed while this worker still held the entry
            if type(fields) is list:  # raw reply: [field, value, ...]
                payload = fields[1] if len(fields) == 2 and fields[0] == b"j" else None
                if payload is None:
                    fields = dict(zip(fields[::2], fields[1::2]))
                    payload = fields.get(b"j")
            else:
                payload = fields.get(b"j")
            if payload is None:
                self.settler.dead(keys, entry_id, msgpack.packb({k.decode(errors="replace"): v for k, v in fields.items()}),
                                  "decode_failed", error_class="DecodeError",
                                  error="stream entry has no 'j' field (not written by a Chasqui producer)")
                continue
            if len(payload) > self.max_payload_bytes:
                self.settler.dead(keys, entry_id, payload, "oversize", error_class="PayloadTooLarge",
                                  error=f"payload is {len(payload)} bytes; this worker accepts at most "
                                        f"{self.max_payload_bytes}")
                continue
            try:
                job = decode(payload)
            except DecodeError as exc:
                self.settler.dead(keys, entry_id, payload, "decode_failed", error_class="DecodeError", error=str(exc))
                continue
            if deliveries > 1 and job.deaths + deliveries - 1 >= PANIC_AFTER_DEATHS:
                self.settler.dead(keys, entry_id, payload, "panic", job_id=job.id, task=job.task,
                                  error_class="WorkerLost",
                                  error=f"the job was running when its worker died {job.deaths + deliveries - 1} times")
                continue
            handler = self.registry.get(job.task)
            if handler is None:
                self.settler.dead(keys, entry_id, payload, "unknown_task", job_id=job.id, task=job.task,
                                  error_class="UnknownTask",
                                  error=f"no task named {job.task!r} is registered in this worker")
                continue
            self._held[entry_id] = (keys, now)
            delivery = Delivery(keys, entry_id, payload, job, handler, deliveries,
                                budget(job, handler, self.policy))
            if handler.is_async:
                self._inbox.append(delivery)
                accepted += 1
            else:
                if self._lane is None:
                    self._lane = SyncLane(self.concurrency, self.id, self._on_sync_outcomes)
                self._lane.submit(delivery)
        if accepted:
            self._inbox_ready.set()

    # --- running ------------------------------------------------------------------

    def _start_slot(self, number: int) -> asyncio.Task:
        task = asyncio.create_task(self._slot(), name=f"slot:{number}")
        task.add_done_callback(lambda t: self._slot_ended(t, number))
        return task

    def _slot_ended(self, task: asyncio.Task, number: int) -> None:
        """A slot that died is logged, reported in the heartbeat, and started again."""
        if task.cancelled() or task.exception() is None or self._stop.is_set():
            return
        exc = task.exception()
        self.problem = f"slot {number} died ({class_path(exc)}: {_message(exc)}) and was restarted"
        logger.error("worker %s: %s", self.id, self.problem, exc_info=exc)
        self._slots[number] = self._start_slot(number)

    async def _slot(self) -> None:
        inbox = self._inbox
        while True:
            if not inbox:
                self._inbox_ready.clear()
                await self._inbox_ready.wait()
                continue
            delivery = inbox.popleft()
            if delivery is None:
                return
            if self._stop.is_set():
                # Stopping: the reader may still be blocked in XREADGROUP, and
                # a job not started by now must not start; it goes back as it was.
                self._requeue(delivery)
                continue
            if self.buffered <= self.prefetch // 2:
                self._room.set()
            self._running += 1
            try:
                await self._execute(delivery)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # _execute is total; this is the last line of defence for the slot
                self._internal(delivery, "running the job", exc)
            finally:
                self._running -= 1

    async def _execute(self, d: Delivery) -> None:
        job, handler = d.job, d.handler
        started = now_ms()
        t0 = time.perf_counter()
        try:
            result = await handler.fn(*d.handler_args(self.id), **job.kwargs)
            if job.result_ttl:
                check_json_types(result, "return value")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a handler fail its job, not the worker
            self._outcome(d, exc, started, int((time.perf_counter() - t0) * 1000), failed=True)
            return
        self._outcome(d, result, started, int((time.perf_counter() - t0) * 1000), failed=False)

    def _outcome(self, d: Delivery, value: Any, started: int, duration: int, *, failed: bool) -> None:
        """Record what a run came to; whatever goes wrong doing so touches this job only.

        Formatting the error, computing the backoff, encoding the job or its
        result can each raise (a user's backoff strategy returning None, a
        return value msgpack refuses...). Such a job goes to the dead-letter
        queue as ``internal``, with what went wrong; the slot and every other
        job carry on.
        """
        try:
            if failed:
                self._failed(d, value, started, duration)
            else:
                self._succeeded(d, value, started, duration)
        except Exception as exc:
            self._internal(d, "recording the outcome", exc)

    def _internal(self, d: Delivery, doing: str, exc: BaseException) -> None:
        """Dead-letter a job whose outcome could not be recorded, with reason ``internal``."""
        error = f"{doing} failed: {class_path(exc)}: {_message(exc)}"
        logger.error("job %s (%s): %s; moved to the dead-letter queue (internal)", d.job.id, d.job.task, error,
                     exc_info=exc)
        self._held.pop(d.entry_id, None)
        try:
            self.settler.dead(d.keys, d.entry_id, d.payload, "internal", job_id=d.job.id, task=d.job.task,
                              error_class=class_path(exc), error=error)
        except Exception:  # not even that: the entry stays pending and is reclaimed after the visibility timeout
            logger.exception("job %s: could not be dead-lettered either; it will be reclaimed", d.job.id)

    def _requeue(self, d: Delivery) -> None:
        """Put a fetched job that never started back on the stream, as it was."""
        self._held.pop(d.entry_id, None)
        self.settler.requeue(d.keys, d.entry_id, d.payload)

    def _on_sync_outcomes(self, outcomes: list) -> None:
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

    def _succeeded(self, d: Delivery, result: Any, started: int, duration: int) -> None:
        job = d.job
        self.stats.processed += 1
        self.stats.succeeded += 1
        if self.stats.processed == self.max_jobs:
            self._recycle(f"{self.max_jobs} jobs processed (max_jobs {self.max_jobs})")
        self._held.pop(d.entry_id, None)
        stored = None
        if job.result_ttl:
            finished = now_ms()
            stored = (d.keys.result + job.id, job.result_ttl * 1000,
                      _result_blob(job, "SUCCESSFUL", started=started, finished=finished, worker=self.id,
                                   return_value=result))
        self.settler.complete(d.keys, d.entry_id, job.id, job.task, duration, stored)

    def _failed(self, d: Delivery, exc: BaseException, started: int, duration: int) -> None:
        job = d.job
        self.stats.processed += 1
        self.stats.failed += 1
        if self.stats.processed == self.max_jobs:
            self._recycle(f"{self.max_jobs} jobs processed (max_jobs {self.max_jobs})")
        self._held.pop(d.entry_id, None)
        finished = now_ms()
        runs_made = job.attempt + d.deliveries
        message = _message(exc)
        record = error_record(
            attempt=runs_made, exc_class=class_path(exc), message=message,
            traceback=printable(format_exception(exc)), worker=self.id, started_at=started, finished_at=finished,
        )
        decision = decide(job, exc, runs_made, d.handler, self.policy)
        if decision.retry:
            record["backoff_ms"] = decision.delay_ms
        retried = Job(job.id, job.task, job.args, job.kwargs, runs_made, job.created_at, job.max_attempts,
                      job.backoff, [*job.errors, record], job.replays, job.result_ttl,
                      job.deaths + d.deliveries - 1, job.meta)
        payload = retried.encode()
        message = message or type(exc).__name__
        stored = None
        if job.result_ttl:
            status = "READY" if decision.retry else "FAILED"
            stored = (d.keys.result + job.id, job.result_ttl * 1000,
                      _result_blob(retried, status, started=started, finished=finished, worker=self.id))
        if decision.retry:
            if self._retry_lines.allow():
                logger.info("job %s (%s) failed on attempt %d: %s: %s; retrying in %d ms", job.id, job.task,
                            runs_made, record["class"], message, decision.delay_ms)
            self.settler.retry(d.keys, d.entry_id, decision.delay_ms, payload, job_id=job.id, task=job.task,
                               attempt=runs_made, error_class=record["class"], error=message,
                               duration_ms=duration, result=stored)
        else:
            if self._dead_lines.allow():
                logger.warning("job %s (%s) failed on attempt %d: %s: %s; moved to the dead-letter queue (%s)",
                               job.id, job.task, runs_made, record["class"], message, decision.reason)
            self.settler.dead(d.keys, d.entry_id, payload, decision.reason, job_id=job.id, task=job.task,
                              error_class=record["class"], error=message, handler_failed=True,
                              duration_ms=duration, result=stored)

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
        rss_mb = resident_memory_mb()
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
                await self._extend_leases(now)
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
            self._retry_lines.summarise()
            self._dead_lines.summarise()
            await asyncio.sleep(min(lease_every, reclaim_every, self.heartbeat_interval))

    async def _extend_leases(self, now: float) -> None:
        """Renew the lease of every entry held longer than a third of the visibility timeout."""
        horizon = self.visibility_timeout_ms / 3000
        stale: dict[str, list[bytes]] = {}
        keys_by_queue: dict[str, QueueKeys] = {}
        for entry_id, (keys, since) in list(self._held.items()):
            if now - since >= horizon:
                stale.setdefault(keys.queue, []).append(entry_id)
                keys_by_queue[keys.queue] = keys
                self._held[entry_id] = (keys, now)
        for queue, ids in stale.items():
            for entry_id in await extend_leases(self.scripts, keys_by_queue[queue], self.id, ids):
                logger.warning("entry %s on %s was reclaimed by another worker while this one held it "
                               "(the event loop was blocked past the visibility timeout?)", entry_id.decode(), queue)

    async def _reclaim(self) -> None:
        for keys in self.keys:
            if self._paused[keys.queue]:
                continue
            cursor = b"0-0"
            for _ in range(10):  # bounded work per round
                room = self.prefetch - self.buffered
                if room <= 0:
                    return
                cursor, entries = await reclaim(self.scripts, keys, self.id, min_idle_ms=self.visibility_timeout_ms,
                                                limit=min(room, 500), cursor=cursor)
                for e in entries:
                    logger.warning("reclaimed job entry %s on %s from a worker that stopped answering "
                                   "(delivery %d)", e.entry_id.decode(), keys.queue, e.deliveries)
                    self._accept(keys, [(e.entry_id, e.fields)], e.deliveries)
                if cursor in (b"0-0", "0-0"):
                    break

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
            "problem": self.problem, "supervisor": self.supervisor_pid,
        })
        pipe = self.client.pipeline(transaction=False)
        for k in self.keys:
            pipe.hset(k.workers, self.id, info)
            pipe.exists(k.paused)
        replies = await pipe.execute()
        for k, paused in zip(self.keys, replies[1::2]):
            if self._paused[k.queue] and not paused:
                logger.info("queue %s resumed", k.queue)
            elif paused and not self._paused[k.queue]:
                logger.info("queue %s is paused: not reading from it", k.queue)
            self._paused[k.queue] = bool(paused)

    async def _unregister(self) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in self.keys:
                pipe.hdel(k.workers, self.id)
            await pipe.execute()
        except Exception:
            pass

