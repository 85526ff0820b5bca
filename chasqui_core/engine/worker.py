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
import contextlib
import contextvars
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from .admission import Admission
from .connection import DEFAULT_URL, aconnect, ais_cluster, is_cluster_client, masked
from .envelope import check_json_types, now_ms
from .errors import JobTimeout, RedisConfigError
from .idempotency import completed_by
from .inflight import InFlight
from .journal import StartJournal
from .keys import GROUP, QUEUES_REGISTRY, QueueKeys
from .link import unavailable
from .outcomes import Delivery, Outcomes
from .promoter import Promoter
from .queue import DEFAULT_MAX_PAYLOAD_BYTES
from .reader import Reader
from .recovery import Leases, forget_dead_workers, reclaim_abandoned
from .registry import HandlerRegistry, check_timeout
from .retry import RetryPolicy
from .scheduler import Fire, Scheduler, queue_fire
from .schedules import Schedule
from .scripts import Scripts
from .settler import Settler
from .signing import Signer
from .sync_lane import FAILED, REQUEUE, SyncLane
from .tracebacks import class_path, message

logger = logging.getLogger("chasqui.worker")

CURRENT_JOBS_SHOWN = 20
"""How many running jobs a heartbeat lists (the oldest first): enough to spot a stuck one."""

DEADLINE_TICK_S = 0.2
"""How often sync jobs are checked against their timeouts (async jobs have a timer each)."""

CONNECT_BACKOFF_S = (0.5, 10.0)
"""First and longest wait between tries while Redis cannot be reached at start."""


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
        job_timeout: float | None = None,
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
        self.job_timeout = check_timeout(job_timeout, "job_timeout")
        """Seconds a run may take when neither the job nor its task says; None: no limit."""
        self.supervisor_pid = supervisor_pid
        """The pid of the supervisor that started this process, shown with its heartbeat; None when standalone."""
        self.signer = Signer(signing_keys) if signing_keys else None
        self._signing_keys = list(signing_keys)
        """With signing keys, only jobs signed with one of them run; the others are dead-lettered as
        ``bad_signature`` before their task is looked up (see signing.py)."""
        self.recycle_reason = ""
        """Why the worker stopped itself (``max_jobs``, ``max_memory_mb``, a sync job past its timeout); "" if not."""
        self.schedules = list(schedules)
        """Schedules this worker fires while it leads the scheduler (every worker may; one leads)."""
        self.fire = fire
        """Adds a fire's job; None adds it with an engine Queue (the Django integration passes its own)."""
        self.hostname = socket.gethostname()
        self.id = worker_id or f"{self.hostname}:{os.getpid()}:{os.urandom(3).hex()}"
        self.stats = WorkerStats()
        self.prefetch = max(batch_size, concurrency * 2)
        self.unfinished_sync_jobs = 0
        """Sync jobs still running in threads when run() returned, abandoned ones included (they cannot be
        cancelled: the process must exit without waiting for them)."""
        self.problem = ""
        """What went wrong inside the worker itself, if anything (shown with its heartbeat)."""
        self.paused: dict[str, bool] = {k.queue: False for k in self.keys}
        self.held = InFlight()
        """Every delivery read and not yet handed to the settler, by (queue, entry id)."""
        self._stop = asyncio.Event()  # made anew by each run()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = 0
        self._lane: SyncLane | None = None  # started on the first sync job
        self._inbox: deque[Delivery] = deque()

    # --- public -------------------------------------------------------------

    @property
    def stopping(self) -> asyncio.Event:
        """Set once the worker is asked to stop (or stops itself)."""
        return self._stop

    @property
    def in_flight(self) -> int:
        """Jobs running now, on the loop and in the sync threads."""
        lane = self._lane
        return self._running + (lane.outstanding if lane is not None else 0)

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
            with contextlib.suppress(RuntimeError):  # its loop is closed: the worker has stopped already
                loop.call_soon_threadsafe(stop.set)

    def run_sync(self) -> None:
        asyncio.run(self.run())

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop.set)
        self.journal = StartJournal(self.id, self.url)
        for k in self.keys:
            self.journal.use(k.queue, k.running(self.id))
        if not await self._connect():
            self.journal.close()
            return
        self.outcomes = Outcomes(self.settler, self.policy, self.id)
        self.admission = Admission(self.registry, self.outcomes, self.policy, self.held, signer=self.signer,
                                   max_payload_bytes=self.max_payload_bytes, default_timeout=self.job_timeout)
        self.promoters = {
            k.queue: Promoter(self.client, self.scripts, k, self.id, poll_interval=self.promoter_poll_interval,
                              lock_ttl_ms=self.promoter_lock_ttl_ms)
            for k in self.keys
        }
        self._jobs: set[asyncio.Task[None]] = set()
        """Tasks of the jobs waiting on something now (see ``_dispatch``); a job that never waits is never kept."""
        self._timed_sync: set[Delivery] = set()
        """Sync deliveries with a timeout, until their outcome: the deadline watcher walks these."""
        self._context = contextvars.copy_context()
        """What each job's context starts as: the worker's own, copied per job."""
        self._room = asyncio.Event()
        self._room.set()
        self._leases = Leases(self.scripts, self.id, self.visibility_timeout_ms)
        self.readers = [Reader(self, k) for k in self.keys]

        logger.info("worker %s started on %s (concurrency %d)", self.id,
                    ", ".join(k.queue for k in self.keys), self.concurrency)
        settler_task = self._spawn("settler", lambda: self.settler.run(self._stop))
        reader_tasks = [self._spawn(f"reader:{r.keys.queue}", r.run) for r in self.readers]
        leaders = [self._spawn(f"promoter:{q}", self._leading(p)) for q, p in self.promoters.items()]
        self.scheduler = None
        if self.schedules:
            fire = self.fire or queue_fire(self.url, self._signing_keys[0] if self._signing_keys else None)
            self.scheduler = Scheduler(self.client, self.scripts, self.schedules, fire, self.id,
                                       lock_ttl_ms=self.promoter_lock_ttl_ms)
            leaders.append(self._spawn("scheduler", self._leading(self.scheduler)))
        chores = [self._spawn("housekeeping", self._housekeeping),
                  self._spawn("deadlines", self._watch_deadlines)]
        try:
            await self._stop.wait()
        finally:
            await self._shut_down(settler_task, reader_tasks, leaders, chores)

    # --- start and stop -----------------------------------------------------------

    async def _connect(self) -> bool:
        """Reach Redis and join every queue's group, trying again while it cannot be reached; False if stopped."""
        url = self.url or DEFAULT_URL
        wait = CONNECT_BACKOFF_S[0]
        while True:
            try:
                await ais_cluster(url)  # asked once, without blocking the loop
                self.client = aconnect(self.url, health_check_interval=30)
                self.cluster = is_cluster_client(self.client)
                """A Redis Cluster client: each queue is read on a connection to the master serving its slot."""
                self.scripts = Scripts(self.client)
                self.settler = Settler(self.client, self.scripts, flush_size=max(100, self.batch_size),
                                       flush_interval=self.flush_interval,
                                       on_retry_scheduled=self._on_retry_scheduled, worker_id=self.id)
                for k in self.keys:
                    await self.create_group(k)
                await self.client.sadd(QUEUES_REGISTRY, *[k.queue for k in self.keys])
                await self._heartbeat()
                self.journal.connect()
                return True
            except RedisConfigError:
                raise
            except Exception as exc:
                if not unavailable(exc) and not isinstance(exc, TimeoutError):
                    raise
                logger.warning("worker %s: Redis at %s cannot be reached (%s: %s); trying again in %.0f s",
                               self.id, masked(url), type(exc).__name__, message(exc), wait)
                with contextlib.suppress(Exception):
                    await self.client.aclose()
                await self.sleep_unless_stopped(wait)
                if self._stop.is_set():
                    return False
                wait = min(wait * 2, CONNECT_BACKOFF_S[1])

    async def create_group(self, keys: QueueKeys) -> None:
        """Join (or create) a queue's consumer group, making its stream if needed."""
        try:
            await self.client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _leading(self, leader: Promoter | Scheduler) -> Callable[[], Awaitable[None]]:
        return lambda: leader.run(self._stop)

    def _spawn(self, name: str, work: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run a long-lived part of the worker, restarting it if it fails: a part that died silently would leave
        the worker heartbeating and holding locks while it reads or settles nothing."""
        async def keep() -> None:
            wait = 0.5
            while not self._stop.is_set() or name == "settler":
                try:
                    await work()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.problem = f"{name} failed ({class_path(exc)}: {message(exc)}); restarted"
                    logger.error("worker %s: %s stopped with an error; starting it again in %.1f s", self.id, name,
                                 wait, exc_info=exc)
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, 10.0)
        return asyncio.create_task(keep(), name=name)

    async def _shut_down(self, settler_task: asyncio.Task[None], readers: list[asyncio.Task[None]],
                         leaders: list[asyncio.Task[None]], chores: list[asyncio.Task[None]]) -> None:
        logger.info("worker %s stopping", self.id)
        while not all(r.done() for r in readers):  # cut blocked reads short rather than wait out BLOCK
            for reader in self.readers:
                await reader.unblock()
            await asyncio.wait(readers, timeout=0.05)
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
                           "reclaimed by another worker, their runs charged", self.id, self.in_flight,
                           self.shutdown_timeout)
        jobs = list(self._jobs)
        for task in jobs:
            task.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        if self._lane is not None:
            self.unfinished_sync_jobs = self._lane.outstanding + self._lane.abandoned
            self._lane.close()
        for chore in chores:
            chore.cancel()
        await asyncio.gather(*chores, return_exceptions=True)
        try:
            await asyncio.wait_for(self.settler.flush(), timeout=max(5.0, self.shutdown_timeout))
        except Exception as exc:
            logger.error("worker %s: the last outcomes could not be settled (%s: %s); their entries stay pending "
                         "and are reclaimed", self.id, type(exc).__name__, exc)
        settler_task.cancel()
        await asyncio.gather(settler_task, *leaders, return_exceptions=True)
        await self._unregister()
        self.journal.close()
        await self.client.aclose()
        logger.info("worker %s stopped (%d processed)", self.id, self.stats.processed)

    def _on_retry_scheduled(self, queue: str, due_ms: int, server_ms: int) -> None:
        promoter = self.promoters.get(queue)
        if promoter is not None:
            promoter.hint(due_ms, server_ms)

    # --- what the readers call ----------------------------------------------------

    def room_to_read(self) -> int | None:
        """How many entries a reader may fetch now; None when the inbox is too full to read."""
        room = self.prefetch - self.buffered
        if room < min(self.batch_size, self.prefetch) // 2 + 1:
            self._room.clear()
            return None
        return min(self.batch_size, room)

    async def wait_room(self) -> None:
        waiter = asyncio.ensure_future(self._room.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()

    async def sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def take(self, keys: QueueKeys, entries: list[Any]) -> None:
        """Take in entries read from a queue: admit them, then start or queue each one."""
        self.settler.fetched(keys, len(entries))
        keyed: list[Delivery] | None = None
        to_dispatch = False
        stopping = self._stop.is_set()
        for d in self.admission.admit(keys, entries):
            if stopping:  # read while stopping (a lease pass's orphans): it must not start now
                self._requeue(d)
            elif d.idempotency_key is not None:
                if keyed is None:
                    keyed = []
                keyed.append(d)
            elif d.handler.is_async:
                self._inbox.append(d)
                to_dispatch = True
            else:
                self._to_lane(d)
        if to_dispatch:
            self._dispatch()
        if keyed:
            await self._screen(keys, keyed)

    def _to_lane(self, d: Delivery) -> None:
        if self._lane is None:
            self._lane = SyncLane(self.concurrency, self.id, self._on_sync_outcomes, self.journal)
        if d.timeout is not None:
            self._timed_sync.add(d)
        self._lane.submit(d)

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
                self.held.remove(d)
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
                self._to_lane(d)
        if accepted:
            self._dispatch()

    # --- running ------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start waiting jobs, up to ``concurrency`` running at once, each as a task of its own.

        Jobs start in rounds: as many as there are free slots, announced
        together in the start journal (one send for the round) just before
        the first of them starts. A job's task starts eagerly: it runs in
        this call until the handler first waits on something, so a job that
        never waits finishes here, without a trip through the event loop
        (parked slot coroutines, woken per batch, cost a quarter of a retried
        job's CPU when retries came back in small batches). A job that does
        wait goes on as an ordinary task, and the next job starts when it
        ends. Each job runs in its own copy of the worker's context: a
        context variable a task sets (an activated language, a logging
        field) ends with that job.
        """
        inbox = self._inbox
        base = self._context
        loop = self._loop
        assert loop is not None  # set by run()
        while inbox and self._running < self.concurrency and not self._stop.is_set():
            batch = [inbox.popleft() for _ in range(min(len(inbox), self.concurrency - self._running))]
            started = now_ms()
            marks: dict[str, list[bytes]] = {}
            for d in batch:
                d.started = started
                ids = marks.get(d.keys.queue)
                if ids is None:
                    marks[d.keys.queue] = [d.entry_id]
                else:
                    ids.append(d.entry_id)
            self.journal.started(marks, started)
            for i, d in enumerate(batch):
                if self._stop.is_set():  # a job stopped the worker: the rest of the round never started
                    for rest in reversed(batch[i:]):
                        rest.started = 0
                        inbox.appendleft(rest)
                    break
                self._running += 1
                run = asyncio.Task(self._run_job(d), loop=loop, context=base.copy(), eager_start=True)
                if run.done():  # the job finished inside this call
                    self._job_ended(run, dispatch=False)
                else:
                    self._jobs.add(run)
                    run.add_done_callback(self._job_ended)
                    if d.timeout is not None:
                        d.timer = loop.call_later(max(0.0, d.timeout - (now_ms() - started) / 1000),
                                                  self._time_out, d, run)
            if self.buffered <= self.prefetch // 2:
                self._room.set()

    def _time_out(self, d: Delivery, run: asyncio.Task[None]) -> None:
        if not run.done():
            d.timed_out = True
            run.cancel()

    async def _run_job(self, delivery: Delivery) -> None:
        try:
            await self._execute(delivery)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # _execute is total; this is the last line of defence
            self._internal(delivery, "running the job", exc)
        finally:
            self._running -= 1
            if delivery.timer is not None:
                delivery.timer.cancel()

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
        started = d.started
        t0 = time.perf_counter()
        try:
            result = await handler.fn(*d.handler_args(self.id), **job.kwargs)
            if job.result_ttl:
                check_json_types(result, "return value")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not d.timed_out or task is None:
                raise
            task.uncancel()
            self._outcome(d, JobTimeout(d.timeout or 0), started, int((time.perf_counter() - t0) * 1000),
                          failed=True)
            return
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a handler fail its job, not the worker
            self._outcome(d, exc, started, int((time.perf_counter() - t0) * 1000), failed=True)
            return
        self._outcome(d, result, started, int((time.perf_counter() - t0) * 1000), failed=False)

    def _outcome(self, d: Delivery, value: Any, started: int, duration: int, *, failed: bool) -> None:
        """Hand a finished run to the outcomes; whatever goes wrong there touches this job only."""
        if not self.held.remove(d):
            return  # written already: a sync run that passed its timeout, reporting at last
        if d.timeout is not None:
            self._timed_sync.discard(d)
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
        self.held.remove(d)
        self.outcomes.internal(d, doing, exc)

    def _requeue(self, d: Delivery) -> None:
        self.held.remove(d)
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

    async def _watch_deadlines(self) -> None:
        """Time out sync runs past their deadline: write their outcome, and give up their thread."""
        while True:
            await asyncio.sleep(DEADLINE_TICK_S)
            if not self._timed_sync:
                continue
            now = now_ms()
            for d in list(self._timed_sync):
                if d.started and d.timeout is not None and now - d.started >= d.timeout * 1000:
                    self._sync_timed_out(d, now)

    def _sync_timed_out(self, d: Delivery, now: int) -> None:
        lane = self._lane
        assert lane is not None  # only sync deliveries are watched
        lane.abandon(d)
        self._outcome(d, JobTimeout(d.timeout or 0), d.started, now - d.started, failed=True)
        what = f"sync job {d.job.id} ({d.job.task}) ran past its timeout of {d.timeout:g} s"
        if self.supervisor_pid is not None:
            self._recycle(f"{what}; its thread cannot be stopped, so a fresh process takes this one's place")
        else:
            logger.warning("worker %s: %s; its thread cannot be stopped: it is abandoned and another takes its "
                           "place (run under a supervisor, runworker --processes, to have the process replaced)",
                           self.id, what)
            lane.replace()

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
        last_lease = last_heartbeat = last_reclaim = last_forget = 0.0
        lease_every = self._leases.every
        reclaim_every = max(0.05, min(self.visibility_timeout_ms / 2000, 15.0))
        forget_every = max(0.5, min(self.dead_worker_grace_ms / 4000, 60.0))
        while True:
            now = time.monotonic()
            try:
                if now - last_lease >= lease_every:
                    await self._keep_leases()
                    last_lease = now
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
                logger.warning("housekeeping: %s: %s", type(exc).__name__, exc)
            self.outcomes.summarise_logs()
            self.admission.summarise_logs()
            self.journal.summarise_logs()
            await asyncio.sleep(min(lease_every, reclaim_every, self.heartbeat_interval))

    async def _keep_leases(self) -> None:
        """Alive keys, renewals and orphans, queue by queue (see recovery.Leases)."""
        for keys in self.keys:
            kept = await self._leases.keep(keys, [*self.held.by_queue(keys), *self.settler.unsettled(keys)])
            if kept.orphans:
                logger.warning("worker %s: %d entries on %s were pending on this worker but not held by it; taking "
                               "them in now", self.id, len(kept.orphans), keys.queue)
                await self.take(keys, kept.orphans)

    async def _reclaim(self) -> None:
        for keys in self.keys:
            if not self.paused[keys.queue]:
                await reclaim_abandoned(self.scripts, keys, self.id, min_idle_ms=self.visibility_timeout_ms)

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
            if self.paused[k.queue] and not paused:
                logger.info("queue %s resumed", k.queue)
            elif paused and not self.paused[k.queue]:
                logger.info("queue %s is paused: not reading from it", k.queue)
            self.paused[k.queue] = bool(paused)

    def _current_jobs(self) -> list[list[Any]]:
        """The longest-running jobs (task, job id, started at ms), at most CURRENT_JOBS_SHOWN of them."""
        return [[d.job.task, d.job.id, d.started] for d in self.held.running()[:CURRENT_JOBS_SHOWN]]

    async def _unregister(self) -> None:
        """Leave the workers list and drop the alive key; the start journal too, unless runs are still under way
        (then another worker reclaims their entries, charged)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in self.keys:
                pipe.hdel(k.workers, self.id)
                pipe.delete(k.alive(self.id))
                if not self.in_flight:
                    pipe.delete(k.running(self.id))
            await pipe.execute()
        except Exception:
            pass
