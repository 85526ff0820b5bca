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
passes ``max_memory_mb`` (or a sync run it cannot stop passed its timeout),
and says why in ``recycle_reason``. Under a supervisor
(chasqui_core/supervisor.py) it asks for a successor (``ask_successor``) and
works on until the successor reads its queues, then stops the same graceful
way; so a queue is never left unread while a process starts. Standalone, it
stops at once. That is how a slow leak in task code is kept in check without
anyone watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from chasqui_core.engine.ops import cancel
from chasqui_core.engine.worker import collector
from chasqui_core.engine.worker.admission import Admission
from chasqui_core.engine.worker.cancel_watch import Watch
from chasqui_core.engine.ops.control import QUIET, QUIET_STATE, RUNNING, STOP, STOPPING
from chasqui_core.engine.dlq.operations import OperationsLoop
from chasqui_core.engine.store.connection import DEFAULT_URL, aconnect, ais_cluster, is_cluster_client, masked
from chasqui_core.engine.jobs.errors import RedisConfigError
from chasqui_core.engine.worker.housekeeping import Housekeeping, resident_kb
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.recovery.ended_runs import ended_runs_of
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.worker.limits import Limit, LimitGate, Limits, parse_limits
from chasqui_core.engine.store.keys import BANDS, GROUP, HIGH, QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.producer.link import unavailable
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.jobs.priority import STRICT, check_mode
from chasqui_core.engine.timing.promoter import Promoter
from chasqui_core.engine.producer.queue import DEFAULT_MAX_PAYLOAD_BYTES
from chasqui_core.engine.worker.reader import Reader
from chasqui_core.engine.jobs.registry import HandlerRegistry, check_timeout
from chasqui_core.engine.settle.retry import RetryPolicy
from chasqui_core.engine.worker.running import Runner
from chasqui_core.engine.timing.scheduler import Fire, Scheduler, queue_fire
from chasqui_core.engine.timing.schedules import Schedule
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.jobs.signing import Signer
from chasqui_core.engine.jobs.tracebacks import class_path, message

logger = logging.getLogger("chasqui.worker")

PROBLEM_SHOWN_S = 60.0
"""How long a worker's heartbeat keeps showing a problem of its own after it was last seen."""

CONNECT_BACKOFF_S = (0.5, 10.0)
"""First and longest wait between tries while Redis cannot be reached at start."""


@dataclass(slots=True)
class WorkerStats:
    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    started_at: float = field(default_factory=time.time)


class Worker:
    """Composes a worker's parts and is the only one that knows them all: the readers, the runner, the settler,
    housekeeping, the leaders (promoters, scheduler), the cancel watch and the DLQ operations loop."""

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
        limits: Mapping[str, Any] | Sequence[Limit] | None = None,
        cancel_grace: float = cancel.DEFAULT_GRACE_S,
        priority_mode: str = STRICT,
    ) -> None:
        if not queues:
            raise ValueError("A worker needs at least one queue")
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
        self.keys = [QueueKeys.for_queue(q) for q in dict.fromkeys(queues)]
        self.streams: dict[str, list[QueueKeys]] = {k.queue: [k] for k in self.keys}
        """Each queue's streams, highest priority band first: its own, and those of the bands a job was added to
        (``learn_bands``). Leases, reclaims and journals work per stream."""
        self.priority_mode = check_mode(priority_mode)
        """Which job starts next among those fetched: ``strict`` or ``weighted`` (priority.py)."""
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
        if isinstance(cancel_grace, bool) or not isinstance(cancel_grace, (int, float)) or not cancel_grace >= 0:
            raise ValueError(f"cancel_grace must be a number of seconds, 0 or more, got {cancel_grace!r}")
        self.cancel_grace = float(cancel_grace)
        """Seconds a running sync job may go on once told it is cancelled, before it is given up (cancel.py)."""
        self.supervisor_pid = supervisor_pid
        """The pid of the supervisor that started this process, shown with its heartbeat; None when standalone."""
        self.signer = Signer(signing_keys) if signing_keys else None
        self._signing_keys = list(signing_keys)
        """With signing keys, only jobs signed with one of them run; the others are dead-lettered as
        ``bad_signature`` before their task is looked up (see signing.py)."""
        self.recycle_reason = ""
        """Why the worker stopped itself (``max_jobs``, ``max_memory_mb``, a sync job past its timeout); "" if not."""
        self.limits = Limits(parse_limits(limits), (k.queue for k in self.keys))
        """Rate and concurrency limits on these queues and their tasks (limits.py); empty: none."""
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
        self._problem = ""
        self._problem_at = 0.0
        self.paused: dict[str, bool] = {k.queue: False for k in self.keys}
        self.quiet = False
        """Asked to take no more jobs (control.py): the readers rest, what was fetched and not started went back."""
        self.stopped_by_operator = False
        """Stopped by an operator's command (control.py) rather than a signal or a limit."""
        self.held = InFlight()
        """Every delivery read and not yet handed to the settler, by reference."""
        self.runner: Runner | None = None
        """What runs the jobs read (running.py); made by each ``run()`` once Redis answers."""
        self._stop = asyncio.Event()  # made anew by each run()
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- public -------------------------------------------------------------

    @property
    def problem(self) -> str:
        """What went wrong inside the worker itself lately, if anything (shown with its heartbeat): a problem not
        seen again for ``PROBLEM_SHOWN_S`` is over (a reader that failed while Redis restarted reads again)."""
        if self._problem and time.monotonic() - self._problem_at > PROBLEM_SHOWN_S:
            self._problem = ""
        return self._problem

    @problem.setter
    def problem(self, text: str) -> None:
        self._problem = text
        self._problem_at = time.monotonic()

    @property
    def stopping(self) -> asyncio.Event:
        """Set once the worker is asked to stop (or stops itself)."""
        return self._stop

    @property
    def in_flight(self) -> int:
        """Jobs running now, on the loop and in the sync threads."""
        runner = self.runner
        return runner.in_flight if runner is not None else 0

    @property
    def state(self) -> str:
        """``running``, ``quiet`` or ``stopping``, as the heartbeat reports it."""
        if self._stop.is_set():
            return STOPPING
        return QUIET_STATE if self.quiet else RUNNING

    async def obey(self, command: str | None) -> bool:
        """Act on an operator's command (control.py); True when the worker's state changed."""
        if command == STOP and not self._stop.is_set():
            logger.info("worker %s: stopping, as an operator asked", self.id)
            self.stopped_by_operator = True
            self._stop.set()
            return True
        if command == QUIET and not self.quiet and not self._stop.is_set():
            logger.info("worker %s: quiet, as an operator asked: taking no more jobs, finishing the %d running",
                        self.id, self.in_flight)
            self.quiet = True
            for reader in self.readers:  # a read blocked now returns at once, empty
                await reader.unblock()
            if self.runner is not None:  # fetched, never started: back on the stream as they were, uncharged
                self.runner.give_back_unstarted()
            return True
        return False

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
        self.journal = StartJournal(self.id, self.url, ended_runs_of(self.id))
        for k in self.keys:
            self.journal.use(k.stream, k.running(self.id), dispatching=k.dispatching(self.id))
        if not await self._connect():
            self.journal.close()
            return
        self.outcomes = Outcomes(self.settler, self.policy, self.id)
        self.admission = Admission(self.registry, self.outcomes, self.policy, self.held, signer=self.signer,
                                   max_payload_bytes=self.max_payload_bytes, default_timeout=self.job_timeout,
                                   limits=self.limits)
        self.gate = LimitGate(self.scripts, self.visibility_timeout_ms)
        self.runner = runner = Runner(
            self.id, concurrency=self.concurrency, prefetch=self.prefetch, priority_mode=self.priority_mode,
            held=self.held, admission=self.admission, outcomes=self.outcomes, settler=self.settler,
            journal=self.journal, client=self.client, limits=self.limits, gate=self.gate,
            cancel_copies=cancel.Copies(), stop=self._stop, stats=self.stats, max_jobs=self.max_jobs,
            recycles=self.supervisor_pid is not None, recycle=self._recycle,
            retry_hint=self._on_retry_scheduled, report_problem=self._report_problem)
        self.promoters = {
            k.queue: Promoter(self.client, self.scripts, k, self.id, poll_interval=self.promoter_poll_interval,
                              lock_ttl_ms=self.promoter_lock_ttl_ms)
            for k in self.keys
        }
        self.housekeeping = Housekeeping(self, runner.take, runner.let_go)
        self.cancel_watch = Watch(self.id, self.client, self.keys, self.held, self.outcomes, self.settler,
                                         runner, self.cancel_grace)
        self.readers = [Reader(self, runner, k) for k in self.keys]

        logger.info("worker %s started on %s (concurrency %d)", self.id,
                    ", ".join(k.queue for k in self.keys), self.concurrency)
        settler_task = self._spawn("settler", lambda: self.settler.run(self._stop), past_stop=True)
        reader_tasks = [self._spawn(f"reader:{r.keys.queue}", r.run) for r in self.readers]
        leaders = [self._spawn(f"promoter:{q}", self._leading(p)) for q, p in self.promoters.items()]
        self.scheduler = None
        if self.schedules:
            fire = self.fire or queue_fire(self.url, self._signing_keys[0] if self._signing_keys else None)
            self.scheduler = Scheduler(self.client, self.scripts, self.schedules, fire, self.id,
                                       lock_ttl_ms=self.promoter_lock_ttl_ms)
            leaders.append(self._spawn("scheduler", self._leading(self.scheduler)))
        chores = [self._spawn("housekeeping", self.housekeeping.run),
                  self._spawn("deadlines", runner.watch_deadlines),
                  self._spawn("operations", OperationsLoop(self.url, self.id, [k.queue for k in self.keys],
                                                           self._stop).run),  # DLQ replays/discards by filter
                  self._spawn("cancels", self.cancel_watch.run)]
        young = collector.roomier_young_generation()
        try:
            await self._stop.wait()
        finally:
            await self._shut_down(settler_task, reader_tasks, leaders, chores)
            collector.restore_young_generation(young)

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
                await Housekeeping(self).heartbeat()
                self.journal.connect()
                return True
            except RedisConfigError:
                raise
            except Exception as exc:
                if not unavailable(exc) and not isinstance(exc, TimeoutError):
                    raise
                logger.warning("worker %s: Redis at %s cannot be reached (%s: %s); trying again in %.1f s",
                               self.id, masked(url), type(exc).__name__, message(exc), wait)
                with contextlib.suppress(Exception):
                    await self.client.aclose()
                await self.sleep_unless_stopped(wait)
                if self._stop.is_set():
                    return False
                wait = min(wait * 2, CONNECT_BACKOFF_S[1])

    def all_streams(self) -> list[QueueKeys]:
        """Every stream this worker reads: each queue's own and its priority bands'."""
        return [k for streams in self.streams.values() for k in streams]

    def learn_bands(self, keys: QueueKeys, bands: Collection[bytes | str]) -> bool:
        """Read the priority bands ``bands`` (the queue's set of them) from now on; True when one was new."""
        names = {b.decode() if isinstance(b, bytes) else b for b in bands}
        known = self.streams[keys.queue]
        if names <= {k.band for k in known}:
            return False
        names &= set(BANDS)  # a member written by something else is not a band: ignored
        streams = keys.band_keys(names | {k.band for k in known})
        if len(streams) == len(known):
            return False
        default = streams[[k.band for k in streams].index("")]
        for k in streams:
            if k not in known:
                self.journal.use_like(k.stream, k.running(self.id), default.stream,
                                        dispatching=k.dispatching(self.id))
                logger.info("worker %s: queue %s has jobs of %s priority: reading its %s band too", self.id,
                            keys.queue, "high" if k.band == HIGH else "low", k.band)
        self.streams[keys.queue] = streams
        return True

    async def create_group(self, keys: QueueKeys) -> None:
        """Join (or create) a queue's consumer group, making its stream if needed."""
        try:
            await self.client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _leading(self, leader: Promoter | Scheduler) -> Callable[[], Awaitable[None]]:
        return lambda: leader.run(self._stop)

    def _spawn(self, name: str, work: Callable[[], Awaitable[None]], *, past_stop: bool = False) -> asyncio.Task[None]:
        """Run a long-lived part of the worker, restarting it if it fails: a part that died silently would leave
        the worker heartbeating and holding locks while it reads or settles nothing. ``past_stop``: restarted
        after the stop too (the settler, which must write the last outcomes)."""
        async def keep() -> None:
            wait = 0.5
            while past_stop or not self._stop.is_set():
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
        await self.housekeeping.announce_stop()
        while not all(r.done() for r in readers):  # cut blocked reads short rather than wait out BLOCK
            for reader in self.readers:
                await reader.unblock()
            await asyncio.wait(readers, timeout=0.05)
        runner = self.runner
        assert runner is not None  # made by run() before any part starts
        runner.give_back_unstarted(stopping=True)  # fetched, never started: back on the stream, as they were
        self.unfinished_sync_jobs = await runner.wind_down(self.shutdown_timeout)
        for chore in chores:
            chore.cancel()
        await asyncio.gather(*chores, return_exceptions=True)
        # The settler ends by itself once it has written everything (a flush of its may be under way now:
        # cancelling it there would drop that batch). Only one that cannot finish is cut short.
        await asyncio.wait({settler_task}, timeout=max(5.0, self.shutdown_timeout))
        if not settler_task.done():
            settler_task.cancel()
        await asyncio.gather(settler_task, *leaders, return_exceptions=True)
        with contextlib.suppress(Exception):  # what is left alone: the counts of entries read
            await asyncio.wait_for(self.settler.flush(), timeout=5.0)
        if self.settler.pending:
            logger.error("worker %s: %d outcomes could not be settled; their entries stay pending and are "
                         "reclaimed", self.id, self.settler.pending)
        await runner.release_slots()
        await self.housekeeping.unregister()
        self.journal.close(keep_ends=bool(self.settler.pending or runner.in_flight))
        await self.client.aclose()
        logger.info("worker %s stopped (%d processed)", self.id, self.stats.processed)

    def _report_problem(self, problem: str) -> None:
        self.problem = problem

    def _on_retry_scheduled(self, queue: str, due_ms: int, server_ms: int) -> None:
        promoter = self.promoters.get(queue)
        if promoter is not None:
            promoter.hint(due_ms, server_ms)

    async def sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    # --- recycling --------------------------------------------------------------------

    ask_successor: Callable[[str], bool] | None = None
    """Set by a supervisor's child (chasqui_core/supervisor.py) that can ask it for a successor: True once asked.

    A worker that recycles then keeps reading until the supervisor, its successor reading already, stops it (as a
    SIGTERM does), so a recycle never leaves its queues unread for the length of a process start. None, or False
    (the supervisor could not be told), and the worker stops at once, as a standalone one does."""

    def _recycle(self, reason: str) -> None:
        """Make way for a fresh process because a limit was reached: ask the supervisor for a successor and go on
        until told to stop, or, when nobody can be asked, stop now. Either way the stop is graceful: running
        jobs finish, the rest go back to the stream. Called again for each later reason (a second sync run
        past its timeout, each memory check over the limit); the successor is asked for once."""
        if self._stop.is_set():
            return
        if self.recycle_reason:  # another reason while the successor starts: asked for once
            return
        self.recycle_reason = reason
        ask = self.ask_successor
        if ask is not None and ask(reason):
            logger.info("worker %s recycling: %s; it goes on until its successor reads", self.id, reason)
            return
        logger.info("worker %s recycling: %s", self.id, reason)
        self._stop.set()

    def check_memory(self) -> None:
        if self.max_memory_mb is None:
            return
        rss_mb = resident_kb() // 1024
        if rss_mb >= self.max_memory_mb:
            self._recycle(f"memory at {rss_mb} MB (max_memory_mb {self.max_memory_mb})")
