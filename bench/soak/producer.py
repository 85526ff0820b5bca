"""The workload: jobs of every kind at a steady rate, replays from the dead-letter queue, and the drain.

The producer runs in a thread of its own, so that it keeps enqueueing while
the main thread injects faults: an enqueue that meets a Redis restart rides
it out (or fails after the engine's retry window and is tried again later).
Every job gets a job id chosen here (``soak-<kind>-<n>``): adds with a
job id are idempotent, so an enqueue tried again after an error never adds
a second job, and the ledger's ``enqueue`` line is written only once the
add has succeeded.

Workflows, one every ``FLOW_EVERY`` seconds when their kinds are in the run
(``Workflows``): batches with both callbacks, chains of three steps, fan-ins;
their children succeed, die (``flow_fail``), die until fixed and replayed
(``flow_fixed``) or end their worker process once (``flow_crash``, at most
one every ``CRASH_EVERY`` seconds). Each is started by one idempotent
``flow_start.lua`` call, tried again with the same ids after an error, and
recorded in ``flows.jsonl`` for verdict_flows.py once it is sent.

Replays, every ``REPLAY_EVERY`` seconds: every dead ``fixed_by_replay`` (or
``flow_fixed``) job is marked fixed and replayed with one more attempt (it then succeeds); a
few dead ``always_fail`` jobs are replayed with their whole budget again and
a few ``unrecoverable`` ones with one more attempt (they die again). Each
job is replayed at most once per kind of replay, so the workload stays
bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import redis
from django.utils import timezone

from chasqui_core.engine.dlq.entries import decode_entry
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.store.keys import GROUP, QueueKeys

from .kinds import FLOW_QUEUE, Kind
from .ledger import ENQUEUE, REPLAY, LedgerWriter
from .verdict import DeadEntry
from .verdict_flows import FLOWS_FILE, FlowEvidence, FlowState, Workflow, read_workflows

REPLAY_EVERY = 10.0
REPLAYS_PER_ROUND = {"always_fail": (3, True), "unrecoverable": (2, False)}
"""Kind -> (most jobs replayed per round, whether the replay resets the budget)."""
DELAY_SECONDS = (1.0, 8.0)
"""A delayed job's ``run_after``, this many seconds ahead (uniform)."""

FIXED_BY_REPLAY = ("fixed_by_replay", "flow_fixed")
"""Kinds whose dead jobs every replay round marks fixed and replays with one more attempt."""
FLOW_EVERY = 2.0
CRASH_EVERY = 30.0
SHAPES = ("batch", "batch", "chain", "fan_in")
TROUBLE = (None, None, "flow_fail", "flow_fixed")
"""What a batch's last child (or a chain's second step) is besides a plain one, drawn at random."""

PRIORITIES = (-5, 0, 0, 5)
"""Each job's priority, drawn at random: every kind's jobs run, fail, retry, die and are replayed in every
priority band (three streams per queue), half of them in the default band."""


def read_dlq(client, queue: str) -> list[DeadEntry]:
    """Every entry of a queue's dead-letter stream, oldest first."""
    out: list[DeadEntry] = []
    start = "-"
    key = QueueKeys.for_queue(queue).dlq
    while True:
        rows = client.xrange(key, start, "+", count=1000)
        for raw_id, fields in rows:
            dead = decode_entry(queue, raw_id, fields)
            out.append(DeadEntry(dead.job_id, queue, dead.reason, dead.error_class, dead.entry_id, dead.error,
                                 fields.get(b"deliveries", b"").decode()))
        if len(rows) < 1000:
            return out
        start = "(" + rows[-1][0].decode()


def leftovers(client, queues: list[str]) -> dict[str, dict[str, int]]:
    """What each queue still holds: entries not yet read, delayed jobs, delivered but unsettled entries."""
    out = {}
    for queue in queues:
        keys = QueueKeys.for_queue(queue)
        streams = keys.band_keys(b.decode() for b in client.smembers(keys.bands))
        pending = 0
        for band in streams:
            with contextlib.suppress(redis.ResponseError):  # no group yet: nothing was ever read
                pending += int(client.xpending(band.stream, GROUP)["pending"])
        out[queue] = {"stream": sum(int(client.xlen(band.stream)) for band in streams),
                      "delayed": int(client.zcard(keys.delayed)), "pending": pending}
    return out


@dataclass(slots=True)
class _Pending:
    job_id: str
    kind: Kind
    n: int
    run_after: float | None
    priority: int
    asked: float = 0.0
    """When its first send began (the ledger's enqueue time: a worker may read the job before the send returns)."""


class Producer(threading.Thread):
    def __init__(self, kinds: tuple[Kind, ...], tasks_module, ledger: LedgerWriter, client_factory: Callable,
                 queues: list[str], rng: random.Random, rate: float, fixed_dir: str,
                 say: Callable[[str], None]) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.tasks = {k.name: getattr(tasks_module, k.task) for k in kinds}
        self.steady = [k for k in kinds if k.weight]
        self.weights = [k.weight for k in self.steady]
        self.timed = {k.name: (k, k.every / 2) for k in kinds if k.every}
        """Kind -> (kind, offset of its next job): the rare kinds come on a timer, not by weight."""
        self.kinds = {k.name: k for k in kinds}
        self.ledger = ledger
        self.client_factory = client_factory
        self.queues = queues
        self.rng = rng
        self.rate = rate
        self.fixed_dir = fixed_dir
        self.say = say
        self.numbers = itertools.count(1)
        self.made = 0
        self.retry: list[_Pending] = []
        self.enqueue_errors = 0
        self.replayed: dict[str, set[str]] = {name: set() for name in REPLAYS_PER_ROUND}
        self.replays = 0
        self.workflows = Workflows(self) if any(k.flow for k in kinds) else None
        self._halt = threading.Event()
        self._t0 = 0.0

    # --- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        self._t0 = time.monotonic()
        next_replay = REPLAY_EVERY
        while not self._halt.is_set():
            elapsed = time.monotonic() - self._t0
            self.tick(elapsed)
            if elapsed >= next_replay:
                self.replay_round(final=False)
                next_replay = elapsed + REPLAY_EVERY
            self._halt.wait(0.1)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def tick(self, elapsed: float) -> None:
        for pending in self.retry[:]:
            if self._send(pending):
                self.retry.remove(pending)
        due = int(elapsed * self.rate) - self.made
        for _ in range(max(0, due)):
            self.made += 1
            self.enqueue(self.rng.choices(self.steady, self.weights)[0])
        for name, (kind, at) in list(self.timed.items()):
            if elapsed >= at:
                self.enqueue(kind)
                self.timed[name] = (kind, at + kind.every)
        if self.workflows is not None:
            self.workflows.tick(elapsed)

    # --- enqueueing ---------------------------------------------------------------------------

    def enqueue(self, kind: Kind) -> None:
        n = next(self.numbers)
        run_after = time.time() + self.rng.uniform(*DELAY_SECONDS) if kind.delayed else None
        pending = _Pending(f"soak-{kind.name}-{n}", kind, n, run_after, self.rng.choice(PRIORITIES))
        if not self._send(pending):
            self.retry.append(pending)

    def _send(self, p: _Pending) -> bool:
        task = self.tasks[p.kind.name]
        options: dict = {"job_id": p.job_id, "priority": p.priority}
        if not p.asked:
            p.asked = time.time()
        if p.run_after is not None:
            options["run_after"] = timezone.now() + timedelta(seconds=max(0.0, p.run_after - time.time()))
        try:
            task.using(**options).enqueue(p.n)
        except Exception as exc:  # Redis away longer than the engine's retry window: try again, same job id
            self.enqueue_errors += 1
            if self.enqueue_errors <= 5:
                self.say(f"  enqueue of {p.job_id} failed ({type(exc).__name__}: {exc}); will try again")
            return False
        self.ledger.write(j=p.job_id, k=p.kind.name, e=ENQUEUE, t=p.asked)
        return True

    def flush_retries(self) -> int:
        """Try the failed enqueues once more; returns how many never made it."""
        self.retry = [p for p in self.retry if not self._send(p)]
        if self.workflows is not None:
            self.workflows.retry()
            return len(self.retry) + len(self.workflows.unsent)
        return len(self.retry)

    # --- replays ------------------------------------------------------------------------------

    def replay_round(self, *, final: bool) -> int:
        """Replay what this round replays (only ``fixed_by_replay`` jobs when ``final``); returns how many."""
        try:
            client = self.client_factory()
            moved = 0
            for queue in self.queues:
                letters = DeadLetters(client, queue)
                taken = {name: 0 for name in REPLAYS_PER_ROUND}
                for dead in read_dlq(client, queue):
                    kind = self.kinds.get(self._kind(dead.job_id))
                    if kind is None:
                        continue
                    if kind.name in FIXED_BY_REPLAY:
                        open(os.path.join(self.fixed_dir, dead.job_id), "w").close()
                        moved += self._replay(letters, dead, reset=False)
                    elif not final and kind.name in REPLAYS_PER_ROUND:
                        most, reset = REPLAYS_PER_ROUND[kind.name]
                        if taken[kind.name] < most and dead.job_id not in self.replayed[kind.name]:
                            taken[kind.name] += 1
                            self.replayed[kind.name].add(dead.job_id)
                            moved += self._replay(letters, dead, reset=reset)
            return moved
        except redis.RedisError as exc:  # Redis away: the next round does it
            self.say(f"  replay round skipped: {type(exc).__name__}: {exc}")
            return 0

    def _kind(self, job_id: str) -> str:
        return job_id.split("-")[1] if job_id.startswith("soak-") else ""

    def _replay(self, letters: DeadLetters, dead: DeadEntry, *, reset: bool) -> int:
        try:
            moved = letters.replay([dead.entry_id], reset_attempts=reset)
        except redis.RedisError:
            # the reply may be what was lost: the entry is gone if the replay happened
            moved = 0 if letters.client.xrange(letters.keys.dlq, dead.entry_id, dead.entry_id) else 1
        if moved:
            self.ledger.write(j=dead.job_id, k=self._kind(dead.job_id), e=REPLAY, reset=reset)
            self.replays += 1
        return moved


class Workflows:
    """The producer's workflows on ``FLOW_QUEUE``, built through the backend's ``job_spec`` (the steps a
    ``chasqui_core.flows`` workflow builds) and started with the engine's ``prepare_*``/``send``, so that a start
    whose reply was lost is sent again with the same ids and applied once."""

    def __init__(self, producer: Producer) -> None:
        from django.tasks import default_task_backend

        self.p = producer
        self.backend = default_task_backend
        self.path = os.path.join(os.path.dirname(producer.ledger.path), FLOWS_FILE)
        self.next_at = FLOW_EVERY
        self.crash_at = CRASH_EVERY / 2 if "flow_crash" in producer.kinds else float("inf")
        self.unsent: list[tuple[object, Workflow, list[tuple[str, str]]]] = []
        self.asked: dict[str, float] = {}
        """When each unsent workflow's first send began, by its id (the ledger's enqueue time of its first jobs)."""
        self.started = 0

    def _job(self, kind: str, *args):
        """(job id, JobSpec) of a job of ``kind`` with ``args``."""
        job_id = f"soak-{kind}-{next(self.p.numbers)}"
        task = self.p.tasks[kind].using(job_id=job_id, queue_name=FLOW_QUEUE)
        return job_id, self.backend.job_spec(task, list(args), {})[1]

    def tick(self, elapsed: float) -> None:
        self.retry()
        while elapsed >= self.next_at:
            self.next_at += FLOW_EVERY
            crash = elapsed >= self.crash_at
            if crash:
                self.crash_at += CRASH_EVERY
            shape = self.p.rng.choice(SHAPES)
            self.start("batch" if crash and shape == "chain" else shape, crash)

    def start(self, shape: str, crash: bool) -> None:
        from chasqui_core.engine.flows.compose import BatchSpec, prepare_batch, prepare_chain

        queue = self.backend.queue(FLOW_QUEUE)
        rng = self.p.rng
        if shape == "chain":
            n = next(self.p.numbers)
            first = self._job("flow_ok", n)
            second_kind = rng.choice(TROUBLE) or "flow_callback"
            second = self._job(second_kind, n) if second_kind != "flow_fixed" else self._job("flow_fixed")
            third = self._job("flow_callback", n)
            prepared = prepare_chain(queue, [first[1], second[1], third[1]])
            wf = Workflow(prepared.started.id, "chain", ((first[0],), (second[0],), (third[0],)))
            firsts = [(first[0], "flow_ok")]
        else:
            numbers = [next(self.p.numbers) for _ in range(3)]
            kids = [self._job("flow_ok", n) for n in numbers]
            kinds = ["flow_ok"] * 3
            trouble = "flow_crash" if crash else (rng.choice(TROUBLE) if shape == "batch" else None)
            if trouble is not None:
                numbers.append(next(self.p.numbers))
                kids.append(self._job(trouble, numbers[-1]))
                kinds.append(trouble)
            ids = tuple(j for j, _ in kids)
            firsts = list(zip(ids, kinds, strict=True))
            if shape == "batch":
                success, complete = self._job("flow_callback", "success"), self._job("flow_callback", "complete")
                prepared = prepare_batch(queue, BatchSpec([s for _, s in kids], success[1], complete[1]))
                wf = Workflow(prepared.started.id, "batch", (ids,), {"success": success[0], "complete": complete[0]})
            else:  # a fan-in: the last step is fed every child's result, in order
                total = self._job("flow_callback", numbers)
                prepared = prepare_chain(queue, [BatchSpec([s for _, s in kids]), total[1]])
                wf = Workflow(prepared.started.id, "chain", (ids, (total[0],)))
        self.unsent.append((prepared, wf, firsts))
        self.retry()

    def retry(self) -> None:
        """Send what is not sent yet (a start tried again is applied once: ``flow_start.lua``)."""
        from chasqui_core.engine.flows.compose import send

        left = []
        for prepared, wf, firsts in self.unsent:
            asked = self.asked.setdefault(wf.id, time.time())
            try:
                send(self.backend.queue(FLOW_QUEUE), prepared)  # type: ignore[arg-type]
            except Exception as exc:  # Redis away: the next tick sends it, with the same ids
                self.p.enqueue_errors += 1
                if self.p.enqueue_errors <= 5:
                    self.p.say(f"  start of workflow {wf.id} failed ({type(exc).__name__}: {exc}); will try again")
                left.append((prepared, wf, firsts))
                continue
            del self.asked[wf.id]
            for job_id, kind in firsts:
                self.p.ledger.write(j=job_id, k=kind, e=ENQUEUE, t=asked)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(wf.to_line() + "\n")
            self.started += 1
        self.unsent = left


def flow_evidence(client, directory: str) -> FlowEvidence | None:
    """What Redis says of the soak's workflows at the end; None when the run started none."""
    from chasqui_core.engine.flows.batches import UnknownBatch
    from chasqui_core.engine.ops.totals import read_totals
    from chasqui_core.flows import read_status

    path = os.path.join(directory, FLOWS_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        workflows = read_workflows(f)
    states: dict[str, FlowState | None] = {}
    for wf in workflows:
        try:
            s = read_status(client, wf.id)
        except UnknownBatch:
            states[wf.id] = None
            continue
        states[wf.id] = FlowState(s.status, s.stopped_at, {w: c.fired for w, c in s.callbacks.items()})
    counters = read_totals(client, [FLOW_QUEUE])[FLOW_QUEUE].counters
    return FlowEvidence(workflows, states, counters["callbacks"], counters["batches_started"])
