"""How a worker runs what it has read: admitted deliveries to the loop or the sync lane, and their outcomes.

The life of a delivery, in order: ``take`` (admission, then the inbox, the
sync lane or the idempotency screen), ``_dispatch`` (rounds of starts, each
announced in the start journal), ``_execute`` (the handler, its timeout),
``_outcome`` (handed to outcomes.py, which queues it on the settler). Sync
runs come back through ``_on_sync_outcomes``; those past their timeout are
charged by ``watch_deadlines``.

``Runner`` owns the running state (the inbox, the jobs running on the loop,
the sync lane, deadlines, journal marks and slot releases) and gets its
collaborators in its constructor; the worker (worker.py) builds one per
``run()`` and is the only part that knows every other. The per-job path
touches only the runner's own attributes. Two parts of it that a plain job
never meets live beside it as mixins over the same state: the checks before
a start (gates.py: limits, cancel requests, idempotency keys) and the
isolation of suspects after a crash (suspects.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from chasqui_core.engine.ops import cancel
from chasqui_core.engine.worker.admission import Admission
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.worker.delivery import Delivery, ref_of
from chasqui_core.engine.jobs.envelope import check_json_types, now_ms
from chasqui_core.engine.jobs.errors import JobCancelled, JobTimeout
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.limits import LimitGate, Limits
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.jobs.priority import Inbox
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.worker.gates import Gates
from chasqui_core.engine.worker.suspects import Suspects
from chasqui_core.engine.worker.sync_lane import FAILED, LATE, REQUEUE, SyncLane
from chasqui_core.engine.jobs.tracebacks import class_path, message

logger = logging.getLogger("chasqui.worker")


DEADLINE_TICK_S = 0.2
"""How often sync jobs are checked against their timeouts (async jobs have a timer each)."""


class Tally(Protocol):
    """The worker's counts of runs, which the runner keeps up to date (worker.WorkerStats)."""

    processed: int
    succeeded: int
    failed: int


class Runner(Gates, Suspects):
    """Runs one worker's admitted deliveries, up to ``concurrency`` at once, and hands their outcomes on."""

    def __init__(self, worker_id: str, *, concurrency: int, prefetch: int, priority_mode: str,
                 held: InFlight, admission: Admission, outcomes: Outcomes, settler: Settler,
                 journal: StartJournal, client: Client, limits: Limits, gate: LimitGate,
                 cancel_copies: cancel.Copies, stop: asyncio.Event, stats: Tally,
                 max_jobs: int | None = None, recycles: bool = False,
                 recycle: Callable[[str], None], retry_hint: Callable[[str, int, int], None],
                 report_problem: Callable[[str], None]) -> None:
        self.id = worker_id
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.priority_mode = priority_mode
        self.held = held
        self.admission = admission
        self.outcomes = outcomes
        self.settler = settler
        self.journal = journal
        self.client = client
        self.limits = limits
        self.gate = gate
        self.cancel_copies = cancel_copies
        self.stats = stats
        self.max_jobs = max_jobs
        self.recycles = recycles
        """Run under a supervisor: a sync run that cannot be stopped ends with the process, not a new thread."""
        self._stop = stop
        self._recycle = recycle
        self._retry_hint = retry_hint
        self._report_problem = report_problem
        self._loop = asyncio.get_running_loop()
        self._inbox = Inbox(priority_mode)
        self._late: list[Delivery] = []  # limited jobs found late at their start in a turn of _dispatch
        self._reserved: set[Delivery] = set()  # late async jobs retaking their tokens, each keeping its slot
        self._running = 0
        self._lane: SyncLane | None = None  # started on the first sync job
        self._gathering = False
        """Set while one read's bands are taken in (``take_bands``): their jobs start once all are in."""
        self._jobs: set[asyncio.Task[None]] = set()
        """Tasks of the jobs waiting on something now (see ``_dispatch``); a job that never waits is never kept."""
        self._timed_sync: set[Delivery] = set()
        """Sync deliveries with a timeout, until their outcome: the deadline watcher walks these."""
        self._releases: dict[str, list[Delivery]] = {}
        self._side_tasks: set[asyncio.Task[None]] = set()
        """Slot releases under way (held so the loop does not drop them)."""
        self._context = contextvars.copy_context()
        """What each job's context starts as: the worker's own, copied per job."""
        self._room = asyncio.Event()
        self._room.set()
        self.cancelling: set[Delivery] = set()
        """Sync deliveries told to stop, until their outcome or their grace runs out (cancel_watch.Watch)."""
        self._isolating = False
        """Set while a suspect waits to run alone or runs alone (``_run_alone``): nothing else starts."""
        self._suspects: deque[Delivery] = deque()
        """Suspects (a death charged, or counted a recovery) waiting to run alone, in the order read."""
        self._alone: Delivery | None = None
        """The suspect running alone now."""

    @property
    def buffered(self) -> int:
        """Jobs fetched and not yet finished: what counts against the prefetch."""
        lane = self._lane
        buffered = len(self._inbox) + self._running + (lane.outstanding if lane is not None else 0)
        if self._isolating:
            buffered += len(self._suspects)
        return buffered

    @property
    def in_flight(self) -> int:
        """Jobs running now, on the loop and in the sync threads."""
        lane = self._lane
        return self._running + (lane.outstanding if lane is not None else 0)

    # --- what the readers call ----------------------------------------------------

    def room_to_read(self, batch_size: int) -> int | None:
        """How many entries a reader may fetch now; None when the inbox is too full to read."""
        room = self.prefetch - self.buffered
        if self._isolating or room < min(batch_size, self.prefetch) // 2 + 1:  # suspects run first (suspects.py)
            self._room.clear()
            return None
        return min(batch_size, room)

    async def wait_room(self) -> None:
        waiter = asyncio.ensure_future(self._room.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()

    # --- start and stop -----------------------------------------------------------

    def give_back_unstarted(self, *, stopping: bool = False) -> None:
        """Put every fetched job not started back on the stream, uncharged (quiet, stop); ``stopping``: no more."""
        unstarted = [*self._suspects, *self._inbox]
        self._suspects.clear()
        self._inbox.clear()
        if self._lane is not None:
            if stopping:
                self._lane.stopping = True
            unstarted += self._lane.take_unstarted()
        for d in unstarted:
            self._requeue(d)
        if self._alone is None:
            self._isolating = False

    async def wind_down(self, timeout: float) -> int:
        """Let running jobs finish for up to ``timeout`` seconds, then cut the async ones short and close the sync
        lane; how many sync runs were still under way (they cannot be cancelled: the process exits without them)."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.in_flight:
            logger.warning("worker %s: %d jobs still running after %.0fs; they stay pending and will be "
                           "reclaimed by another worker, their runs charged", self.id, self.in_flight, timeout)
        jobs = list(self._jobs)
        for task in jobs:
            task.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        unfinished = 0
        if self._lane is not None:
            unfinished = self._lane.outstanding + self._lane.abandoned
            self._lane.close()
        return unfinished

    async def release_slots(self) -> None:
        """Give back the concurrency slots still waiting to go, and wait (briefly) for the releases under way."""
        self._send_releases()
        if self._side_tasks:
            await asyncio.wait(self._side_tasks, timeout=2.0)

    async def take(self, keys: QueueKeys, entries: list[Any], cancels: bytes | None = cancel.UNKNOWN) -> None:
        """Take in entries read from a queue: admit them, then start or queue each one.

        ``cancels``: the version of the queue's cancel record, read with the entries (reader.py; None: the
        queue never had one); the jobs it names are settled as cancelled instead (cancel.py)."""
        self.settler.fetched(keys, len(entries))
        admitted = self.admission.admit(keys, entries)
        if cancels is not None and admitted:
            admitted = await self._unless_cancelled(keys, admitted, cancels)
        if self.limits:
            limited = [d for d in admitted if d.limits is not None]
            if limited:
                admitted = [d for d in admitted if d.limits is None]
                await self._start(keys, admitted)
                await self._limit(keys, limited)
                return
        await self._start(keys, admitted)

    async def take_bands(self, reads: list[tuple[QueueKeys, list[Any]]], cancels: bytes | None) -> None:
        """Take in one read's entries of several priority bands: all are in the inbox before the first starts."""
        self._gathering = True
        try:
            for keys, entries in reads:
                await self.take(keys, entries, cancels)
        finally:
            self._gathering = False
        self._dispatch()

    async def _start(self, keys: QueueKeys, admitted: list[Delivery]) -> None:
        """Start or queue each admitted delivery (the keyed ones after their idempotency screen)."""
        keyed: list[Delivery] | None = None
        to_lane: list[Delivery] = []
        to_dispatch = False
        stopping = self._stop.is_set()
        for d in admitted:
            if stopping:  # read while stopping (a lease pass's orphans): it must not start now
                self._requeue(d)
            elif d.idempotency_key is not None:
                if keyed is None:
                    keyed = []
                keyed.append(d)
            elif self._isolating or d.suspect:
                self._isolate(d)
            elif d.handler.is_async:
                self._inbox.append(d)
                to_dispatch = True
            else:
                to_lane.append(d)
        if to_lane:  # one hand-over for the lot (sync_lane.py)
            self._to_lane(to_lane)
        if to_dispatch and not self._gathering:
            self._dispatch()
        if keyed:
            await self._screen(keys, keyed)

    def _release(self, d: Delivery) -> bool:
        """Let a delivery go from the worker's hands (its outcome handed on, given back, parked or let go), with
        the concurrency slots it holds; False when it was gone already. The suspect running alone that leaves
        lets the next one go."""
        if not self.held.remove(d):
            return False
        if d.slots:
            self._give_back(d)
        if d is self._alone:
            self._alone = None
            self._loop.call_soon(self._run_alone)
        return True

    def _to_lane(self, d: Delivery | list[Delivery], first: bool = False) -> None:  # first: ahead of the others
        if self._lane is None:
            self._lane = SyncLane(self.concurrency, self.id, self._on_sync_outcomes, self.journal, self.priority_mode)
        batch = d if isinstance(d, list) else [d]
        self._timed_sync.update([x for x in batch if x.timeout is not None])  # watched (watch_deadlines)
        self._lane.submit_many(batch, first=first)

    # --- running ------------------------------------------------------------------

    def _dispatch(self, alone: bool = False) -> None:
        """Start waiting jobs, up to ``concurrency`` running at once, each as a task of its own.

        A job's task starts eagerly: it runs in this call until the handler
        first waits on something, so a job that never waits finishes here,
        without a trip through the event loop. Each job runs in its own copy of
        the worker's context (what a task sets ends with its job).

        Jobs start in rounds, as many as there is room for. One send names a
        round's jobs before it (``journal.dispatching``), one after it marks
        those still running and drops the names: marked running before they
        start, a crash in between (a sync job's, in another thread) would be
        charged to jobs that never ran; a job that kills the process before its
        first ``await`` is caught by the names instead (reclaim.lua counts them
        toward ``panic`` and they run alone next, suspects.py), while the jobs
        only fetched are never counted.
        """
        if self._isolating and not alone:  # a suspect waits to run alone, or runs: nothing else starts
            return
        inbox = self._inbox
        late = self._late
        while inbox and self._running < self.concurrency and not self._stop.is_set():
            room = self.concurrency - self._running
            batch: list[Delivery] = []
            rounds: dict[str, list[bytes]] = {}
            while inbox and len(batch) < room:
                d = inbox.popleft()
                batch.append(d)
                if d.journal is None:  # a suspect running alone is marked running already (suspects.py)
                    rounds.setdefault(d.keys.stream, []).append(d.entry_id)
            if rounds:
                self.journal.dispatching(rounds)
            self._start_round(batch, rounds, late)
        if late:
            self._retake_later(late)
            late.clear()
        if self.buffered <= self.prefetch // 2:
            self._room.set()

    def _start_round(self, batch: list[Delivery], rounds: dict[str, list[bytes]], late: list[Delivery]) -> None:
        """Start one round's jobs, then mark those still running and close the round. A limited job is checked
        for lateness at its own start (what ran before it took time too): the late go to ``late``."""
        base = self._context
        loop = self._loop
        started = now_ms()
        marks: dict[str, list[bytes]] | None = None
        for i, d in enumerate(batch):
            if self._stop.is_set():  # a job of the round asked this process to stop: the rest wait, to go back
                for rest in batch[i:]:
                    self._inbox.append(rest)
                break
            if d.limits and LimitGate.late(d):  # its rate token or slot lapsed while it waited: take it again,
                self._running += 1               # keeping its place: it starts on the reply, not behind the inbox
                self._reserved.add(d)
                late.append(d)
                continue
            d.started = started
            self._running += 1
            run = asyncio.Task(self._run_job(d), loop=loop, context=base.copy(), eager_start=True)
            if run.done():  # the job finished inside this call
                self._job_ended(run, dispatch=False)
                continue
            self._jobs.add(run)
            d.task = run
            run.add_done_callback(self._job_ended)
            if d.timeout is not None:
                d.timer = loop.call_later(max(0.0, d.timeout - (now_ms() - started) / 1000), self._time_out, d, run)
            if d.journal is None:
                d.journal = self.journal
                marks = marks or {}
                marks.setdefault(d.keys.stream, []).append(d.entry_id)
        if marks or rounds:
            self.journal.started(marks, started, rounds)

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
                problem = f"a job's task died ({class_path(exc)}: {message(exc)})"
                self._report_problem(problem)
                logger.error("worker %s: %s", self.id, problem, exc_info=exc)
        if self._isolating:
            self._loop.call_soon(self._run_alone)
        elif dispatch:
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
            if not (d.timed_out or d.cancel_requested) or task is None:
                raise
            task.uncancel()
            why = JobTimeout(d.timeout or 0) if d.timed_out else JobCancelled(
                cancel.describe(d.cancel_requested, running=True))
            self._outcome(d, why, started, int((time.perf_counter() - t0) * 1000), failed=True)
            return
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a handler fail its job, not the worker
            self._outcome(d, exc, started, int((time.perf_counter() - t0) * 1000), failed=True)
            return
        self._outcome(d, result, started, int((time.perf_counter() - t0) * 1000), failed=False)

    def _outcome(self, d: Delivery, value: Any, started: int, duration: int, *, failed: bool) -> None:
        """Hand a finished run to the outcomes; whatever goes wrong there touches this job only."""
        d.end_run()  # struck at once, unless its wrapper or its sync thread did already (journal.py)
        if not self._release(d):
            return  # written already (a sync run that passed its timeout, reporting at last), or let go
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
        self._release(d)
        self.outcomes.internal(d, doing, exc)

    def _requeue(self, d: Delivery) -> None:
        if not self._release(d):
            return  # another worker took it back (``let_go``): it is theirs to run now
        self.outcomes.requeue(d)

    def let_go(self, keys: QueueKeys, entry_ids: list[bytes]) -> None:
        """Let go of held entries of ``keys``'s stream that another worker took back while this one held them
        (it was silent past the visibility timeout; recovery.Leases found them). They are the other's now: one
        not started here never starts, a run under way goes on and its outcome is dropped, and nothing of them
        is written by this worker (a requeue would put a second copy on the stream)."""
        let_go = []
        for entry_id in entry_ids:
            d = self.held.get(ref_of(keys.stream, entry_id))
            if d is None or not self._release(d):
                continue  # settled meanwhile, or let go already
            d.taken_back = True
            let_go.append(d)
            if d.timeout is not None:
                self._timed_sync.discard(d)
            d.end_run()
            if not d.started and d.handler.is_async and d in self._inbox:
                self._inbox.remove(d)
        if let_go:
            logger.warning("worker %s: %d job(s) on %s were taken back by another worker while this one held them "
                           "(it was out of touch past the visibility timeout): %s; they run there now, and what "
                           "they come to here is not written", self.id, len(let_go), keys.queue,
                           ", ".join(d.job.id for d in let_go[:5]) + (" ..." if len(let_go) > 5 else ""))

    def _on_sync_outcomes(self, outcomes: list[Any]) -> None:
        for kind, d, value, started, duration in outcomes:
            if kind == REQUEUE:
                try:
                    self._requeue(d)
                except Exception as exc:
                    self._internal(d, "putting the job back", exc)
            elif kind == LATE:
                self._retake_later([d])
            else:
                self._outcome(d, value, started, duration, failed=kind == FAILED)
        if self._isolating:
            self._run_alone()
        if self.buffered <= self.prefetch // 2:
            self._room.set()

    async def watch_deadlines(self) -> None:
        """Time out sync runs past their deadline: write their outcome, and give up their thread."""
        while True:
            await asyncio.sleep(DEADLINE_TICK_S)
            if self._isolating and self._alone is None:  # the last run ended by a path that did not say so
                self._run_alone()
            if not self._timed_sync:
                continue
            now = now_ms()
            for d in list(self._timed_sync):
                if d.started and d.timeout is not None and now - d.started >= d.timeout * 1000:
                    self._sync_timed_out(d, now)

    def _sync_timed_out(self, d: Delivery, now: int) -> None:
        self.abandon_sync(d, JobTimeout(d.timeout or 0), now,
                          f"sync job {d.job.id} ({d.job.task}) ran past its timeout of {d.timeout:g} s")

    def abandon_sync(self, d: Delivery, exc: BaseException, now: int, what: str) -> None:
        """Write a running sync job's outcome now (``exc``) and give up its thread: a timeout, or a cancel the
        job did not heed within its grace."""
        lane = self._lane
        assert lane is not None  # only sync deliveries are watched
        lane.abandon(d)
        # its run has ended as far as the job is concerned (its outcome is written now), though its thread never
        # returns to strike its journal mark: strike it here, or a crash before the settle would charge a death
        d.end_run()
        self._outcome(d, exc, d.started, now - d.started, failed=True)
        lane.replace()  # another thread takes its place: the lane keeps its size until the process goes
        if self.recycles:
            self._recycle(f"{what}; its thread cannot be stopped, so a fresh process takes this one's place")
        else:
            logger.warning("worker %s: %s; its thread cannot be stopped: it is abandoned and another takes its "
                           "place (run under a supervisor, runworker --processes, to have the process replaced)",
                           self.id, what)
