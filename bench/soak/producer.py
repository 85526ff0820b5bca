"""The workload: jobs of every kind at a steady rate, replays from the dead-letter queue, and the drain.

The producer runs in a thread of its own, so that it keeps enqueueing while
the main thread injects faults: an enqueue that meets a Redis restart rides
it out (or fails after the engine's retry window and is tried again later).
Every job gets a job id chosen here (``soak-<kind>-<n>``): adds with a
job id are idempotent, so an enqueue tried again after an error never adds
a second job, and the ledger's ``enqueue`` line is written only once the
add has succeeded.

Replays, every ``REPLAY_EVERY`` seconds: every dead ``fixed_by_replay`` job
is marked fixed and replayed with one more attempt (it then succeeds); a
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

from .kinds import Kind
from .ledger import ENQUEUE, REPLAY, LedgerWriter
from .verdict import DeadEntry

REPLAY_EVERY = 10.0
REPLAYS_PER_ROUND = {"always_fail": (3, True), "unrecoverable": (2, False)}
"""Kind -> (most jobs replayed per round, whether the replay resets the budget)."""
DELAY_SECONDS = (1.0, 8.0)
"""A delayed job's ``run_after``, this many seconds ahead (uniform)."""

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
        if p.run_after is not None:
            options["run_after"] = timezone.now() + timedelta(seconds=max(0.0, p.run_after - time.time()))
        try:
            task.using(**options).enqueue(p.n)
        except Exception as exc:  # Redis away longer than the engine's retry window: try again, same job id
            self.enqueue_errors += 1
            if self.enqueue_errors <= 5:
                self.say(f"  enqueue of {p.job_id} failed ({type(exc).__name__}: {exc}); will try again")
            return False
        self.ledger.write(j=p.job_id, k=p.kind.name, e=ENQUEUE)
        return True

    def flush_retries(self) -> int:
        """Try the failed enqueues once more; returns how many never made it."""
        self.retry = [p for p in self.retry if not self._send(p)]
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
                    if kind.name == "fixed_by_replay":
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
