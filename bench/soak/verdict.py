"""The accounting: every job of the soak, judged against its kind and its ledger.

A pure function of what was read at the end (the ledger, the dead-letter
entries, the stored results, what is left in Redis, which worker processes
died and when), so that tests can feed it made-up evidence and check that it
flags each kind of discrepancy (tests/bench/test_soak_verdict.py).

The rules, and why. Nothing is excused without evidence: the ledger, the
watcher's deaths, the clean stops the ledger records, and the windows in
which the network faults cut the workers off from Redis.

- **Every job is accounted for.** After the drain, an enqueued job (or a
  fire of a schedule) has either succeeded (an ``ok`` end in the ledger) or
  is in the dead-letter queue, not both, and at most once there. Nothing is
  left in a stream, a delayed set or a pending list.
- **A dead process** is one gone without a clean stop on record: killed by
  the soak, crashed, or gone without the exit line its exit handlers write.
  A process that stopped cleanly (a reload, its supervisor gone, the end)
  settled what it ran: a run without an end in it is a discrepancy, not a
  lost run. A process died when the watcher saw it gone, or sooner, when a
  crash job started in it.
- **A lost run** is one whose dead process died under it: a start without
  an end. A hanging job's run normally has no end (its timeout abandons
  it): it is lost only if its process died before the timeout. A run that
  ended is never lost, however soon its process died after.
- **A lost outcome** is that of a run that ended, when its process died or
  the workers were cut off from Redis after the end and before the job's
  next run (or its dead-letter entry): had the outcome been settled, neither
  would have come. A job runs again after a success, or as the same attempt,
  only after a lost outcome (*ran after success*, *rerun without a lost
  outcome*); a failed run's retry and a replay need no excuse.
- **No job runs more often than its budget.** The engine counts every
  delivery as a run, lost ones included, so the budget holds across
  crashes. A replay adds the budget again (reset) or one run. The one
  documented excess (retries.md, "Execution idempotency"): a run whose
  outcome was lost is run again, so each such rerun allows one run more; a
  job with a lost run may run once more (a run killed before its start was
  journaled is not charged).
- **Never twice at once.** Two runs of one job under way at the same time
  are flagged unless the first one's process was cut off from Redis then.
- **Limits hold where runs start**: no more runs of a limited kind under way
  at once than its concurrency limit, and no more starting within a second
  than its rate limit, across every process, from the ledger's start times.
- **Every attempt charged matches a run**: the attempt numbers of a job's
  runs leave no gap, and a job dead for ``retries_exhausted`` ran its whole
  budget.
- **A replay gives the job a new run.**
- **Every dead-letter reason is the one its kind gets**, and a hanging
  job's last error is a ``...JobTimeout``. ``panic`` is right for any kind
  whose job the ledger shows lost at two process deaths (that is what the
  engine promises: a job in flight during two deaths is a poison pill);
  a ``panic`` without two lost runs in the ledger is a *false panic*, and
  a job charged more than two lost runs went *past the poison-pill limit*
  (it killed a third worker). A lost run the engine did not charge (its
  start-journal mark never reached Redis: the job runs again with the same
  attempt number) does not count there: the recovery count catches those.
  A job whose budget a lost run spent is dead-lettered as
  ``retries_exhausted`` with a ``WorkerLost`` error: right for any kind, if
  the ledger shows a lost run; with a ``LostContact`` error, if one of its
  runs was under way while the workers were cut off from Redis. Where the deaths the engine charged were
  runs that had returned before their process died, the discrepancy is
  named *finished run charged* (a task writes its end line only after it
  told the engine its run ended, tasks.py: the line is the return, not the
  last line before it); where they were runs of a live process cut
  off from Redis, *lost contact charged*: lost contact is not a death.
- *The ledger's start is the task function's first line*; the engine
  counts a run from a moment earlier (its own bookkeeping and Django's
  wrapper run first). A process killed inside that moment is charged by the
  engine and not seen by the ledger. Where a worker process died, on record,
  while the charged attempt was due, that death is the evidence: the
  finding is reported as a *note* (``charged before its first line``) and
  does not fail the soak; a charge with no death while it was due is an
  *attempt without a run*, and does. The false panics the soak has reported so
  far were confirmed by tests/engine/test_start_journal.py, which records
  runs its own way; read a discrepancy against the ledger lines printed
  with it.
- **get_result() agrees**: SUCCESSFUL for a job that succeeded, FAILED for
  one in the dead-letter queue, whatever the reason (READY would tell a
  caller the job is still to run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chasqui_core.engine.settle.retry import RECOVERIES_BEFORE_PANIC

from .kinds import SCHEDULE_PREFIX, Kind, kind_of_job
from .ledger import OK, Ledger, Run
from .run_rules import (CONTACT, DIED, LOST, at_once, charged_deaths, is_lost, most_at_once, most_in_a_second,
                         outcome_lost, timed_out)
from .verdict_flows import FlowEvidence, judge_flows

SUCCESSFUL, FAILED = "SUCCESSFUL", "FAILED"
POISON_PILL_DEATHS = 2
"""Deaths of its workers after which a job is dead-lettered as ``panic`` (docs/retries.md)."""
WORKER_LOST = "WorkerLost"
LOST_CONTACT = "LostContact"
"""The error class the engine records for a run lost with its worker."""


@dataclass(frozen=True, slots=True)
class DeadEntry:
    """One entry of a dead-letter queue, as much of it as the verdict needs."""

    job_id: str
    queue: str
    reason: str
    error_class: str
    entry_id: str
    error: str = ""
    deliveries: str = ""
    """How often the stream entry had been delivered when it died (panics only)."""


@dataclass(frozen=True, slots=True)
class Discrepancy:
    what: str
    """A short name: ``unaccounted``, ``over budget``, ``false panic``..."""
    job_id: str
    kind: str
    detail: str
    lines: tuple[str, ...] = ()
    """The job's ledger lines and dead-letter entries, for the report."""


@dataclass(slots=True)
class Row:
    kind: str
    enqueued: int = 0
    replays: int = 0
    succeeded: int = 0
    dead: Counter = field(default_factory=Counter)
    max_runs: int = 0
    lost_runs: int = 0
    """Runs without an end in a process that is gone without a clean stop."""
    unsettled: int = 0
    """Runs that ended but whose job ran again after their process died or lost contact: outcomes lost."""
    discrepancies: int = 0


@dataclass(slots=True)
class Evidence:
    """What was read at the end of a soak."""

    ledger: Ledger
    kinds: Mapping[str, Kind]
    dead: list[DeadEntry]
    dead_pids: Mapping[int, float | None]
    """Worker processes that are gone, with the time each died when it is known (None: some time)."""
    killed: set[int] = field(default_factory=set)
    """Worker processes the soak killed with SIGKILL."""
    results: Mapping[str, str | None] | None = None
    """Job id -> stored result status (``SUCCESSFUL``, ``FAILED``, ``READY``...; None: no result); None: not read."""
    leftovers: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Queue -> {"stream": n, "delayed": n, "pending": n} after the drain."""
    schedule_fires: Mapping[str, int] = field(default_factory=dict)
    """Schedule name -> fires the scheduler recorded (its state's ``fired`` count)."""
    cut_off: Sequence[tuple[float, float]] = ()
    """(start, end) times, ``time.time()``, during which the network faults cut every worker off from Redis."""
    schedule_missed: Mapping[str, int] = field(default_factory=dict)
    """Schedule name -> due times its state counts as missed (``missed``: skipped by the misfire policy)."""
    flows: FlowEvidence | None = None
    """The workflows and what Redis says of them (verdict_flows.py, whose rules judge them); None: none ran."""


NOTED = frozenset({"charged before its first line"})
"""What the verdict reports with its evidence but does not fail on: the engine counts a run from the moment it
calls the handler, the ledger from the task's first line, and a process that died in between (on record, while
the attempt was due) is the evidence of a run the ledger could not see. Reported so that a reader can check."""


@dataclass(slots=True)
class Verdict:
    rows: dict[str, Row]
    discrepancies: list[Discrepancy]
    problems: list[str]
    """Discrepancies that belong to no one job (a queue not drained, a torn ledger line)."""
    notes: list[Discrepancy] = field(default_factory=list)
    """Findings explained by evidence on record (``NOTED``): shown, never a failure."""

    @property
    def ok(self) -> bool:
        return not self.discrepancies and not self.problems

    def counts(self) -> Counter:
        return Counter(d.what for d in self.discrepancies)


def abrupt_deaths(ev: Evidence) -> set[int]:
    """The processes that are gone without a clean stop on record: killed by the soak, crashed, or exited
    without running their exit handlers. A process that stopped cleanly settled what it ran: it is not dead."""
    return set(ev.killed) | {pid for pid in ev.dead_pids if pid not in ev.ledger.exits}


def death_times(ev: Evidence) -> dict[int, float | None]:
    """When each dead process died: the watcher's time (up to a poll late), or sooner, the start of a run of a
    kind that ends its process at once (a crash job), which is about when it died. A hanging run's fate turns
    on which of its timeout and its process's death came first, sometimes by less than a poll. Never before the
    last line the process wrote: a crash job's ``os._exit`` runs in its own thread, and the other threads of the
    process may write for some milliseconds more before it takes the interpreter (tens of them on a busy host)."""
    died = dict(ev.dead_pids)
    last: dict[int, float] = {}
    for job_id, runs in ev.ledger.runs.items():
        kind = ev.kinds.get(kind_of_job(job_id, ev.ledger.enqueued) or "")
        for r in runs:
            last[r.pid] = max(last.get(r.pid, r.started), r.started, r.ended or r.started)
            if kind is None or not kind.kills:
                continue
            if r.ended is None and r.pid in died:
                at = died[r.pid]
                died[r.pid] = r.started if at is None else min(at, r.started)
    for pid, at in died.items():
        if at is not None and pid in last:
            died[pid] = max(at, last[pid])
    return died


def missing_attempts(runs: list[Run], kind: Kind, replays: list[bool], dead: list[DeadEntry]) -> list[int]:
    """Attempts the engine charged that no run of the ledger carries.

    A job's runs carry their attempt numbers (the task context's, which
    counts every run the job made, across replays: a replay that resets the
    budget goes on from the last number, with a whole budget more, as does
    one that gives one more attempt). So the numbers seen leave no gap from
    1, and a job dead for ``retries_exhausted`` ran every attempt of its
    budget and its replays'.
    """
    seen = {r.attempt for r in runs if r.attempt > 0}
    top = max(seen, default=0)
    if any(d.reason == "retries_exhausted" for d in dead):
        top = max(top, kind.budget + sum(kind.budget if reset else 1 for reset in replays))
    return [n for n in range(1, top + 1) if n not in seen]


def _allowed_runs(kind: Kind, replays: list[bool], lost: int, unsettled: int, uncharged: int = 0) -> int:
    """The runs a job may make: its budget (and its replays'), one more per lost outcome, and one more per lost run
    the engine did not charge (the job ran again as the same attempt: its process died inside a round of starts,
    or its start mark never reached Redis), at least one when any run was lost, at most the recoveries a
    job may have before it is a ``panic``."""
    budget = kind.budget + sum(kind.budget if reset else 1 for reset in replays)
    return budget + unsettled + min(max(uncharged, 1 if lost else 0), RECOVERIES_BEFORE_PANIC)


def _attempt_window(runs: list[Run], attempt: int, enqueued: float, dead_at: float | None) -> tuple[float, float]:
    """When a missing attempt was due: from the end of the last run before it (or the enqueue) to the start of the
    first run after it (or the job's dead-letter entry)."""
    before = [r.ended or r.started for r in runs if 0 < r.attempt < attempt]
    after = [r.started for r in runs if r.attempt > attempt]
    return max(before, default=enqueued), min(after, default=float("inf") if dead_at is None else dead_at)


def _died_between(died: Mapping[int, float | None], abrupt: set[int], start: float, end: float) -> bool:
    return any(pid in abrupt and at is not None and start <= at <= end for pid, at in died.items())


def _entry_time(entry: DeadEntry) -> float:
    """When a dead-letter entry was written: its stream id's milliseconds."""
    return int(entry.entry_id.split("-")[0]) / 1000


def _blame(flag, deaths: int, lost_outcomes: Counter, needed: int, otherwise: str, detail: str) -> None:
    """Name what the engine charged as deaths it should not have: runs that had finished (their process died
    before their outcome was settled), runs cut off from Redis in a live process, or nothing on record."""
    finished, contact = lost_outcomes[DIED], lost_outcomes[CONTACT]
    if deaths + finished >= needed:
        flag("finished run charged", f"charged as lost with its worker, but {finished} of its runs had ended: "
                                     "the process died after the run returned and before its outcome was settled")
    elif deaths + finished + contact >= needed:
        flag("lost contact charged", f"charged as lost with its worker, but {contact} of its runs ended in a process "
                                     "that lived and was only cut off from Redis: lost contact is not a death")
    else:
        flag(otherwise, detail.format(deaths=deaths))


def _schedule_of(job_id: str) -> str:
    """``schedule:<name>:<due ms>`` -> ``<name>``."""
    return job_id[len(SCHEDULE_PREFIX):].rpartition(":")[0]


def judge(ev: Evidence) -> Verdict:
    ledger = ev.ledger
    rows = {name: Row(name) for name in ev.kinds}
    found: list[Discrepancy] = []
    notes: list[Discrepancy] = []
    problems: list[str] = []

    dead_by_job: dict[str, list[DeadEntry]] = {}
    for entry in ev.dead:
        dead_by_job.setdefault(entry.job_id, []).append(entry)

    abrupt = abrupt_deaths(ev)
    died = death_times(ev)
    job_ids = set(ledger.enqueued) | set(ledger.runs) | set(dead_by_job)
    fired_seen: dict[str, set[str]] = {}
    for job_id in sorted(job_ids):
        kind_name = kind_of_job(job_id, ledger.enqueued)
        runs = ledger.runs.get(job_id, [])
        dead = dead_by_job.get(job_id, [])

        def flag(what: str, detail: str, kind_name=kind_name, job_id=job_id, runs=runs, dead=dead) -> None:
            # the job's story in time order: runs, replays, its dead-letter entries (whose ids are times)
            story = [(r.started, r.line()) for r in runs]
            story += [(at, f"replayed at {at:.3f} ({'whole budget again' if reset else 'one more attempt'})")
                      for reset, at in zip(ledger.replays.get(job_id, []), ledger.replayed_at.get(job_id, []),
                                           strict=False)]
            story += [(_entry_time(d),
                       f"dead-letter entry {d.entry_id} on {d.queue}: {d.reason}, {d.error_class}: {d.error[:120]}"
                       + (f" (entry delivered {d.deliveries} times)" if d.deliveries else "")) for d in dead]
            lines = tuple(text for _, text in sorted(story, key=lambda item: item[0]))
            if what in NOTED:
                notes.append(Discrepancy(what, job_id, kind_name or "?", detail, lines))
                return
            found.append(Discrepancy(what, job_id, kind_name or "?", detail, lines))
            if kind_name in rows:
                rows[kind_name].discrepancies += 1

        kind = ev.kinds.get(kind_name) if kind_name else None
        if kind is None:
            flag("never enqueued", "ran or was dead-lettered, but the producer never enqueued it "
                                   "(or its kind was left out of this run)")
            continue
        if job_id.startswith(SCHEDULE_PREFIX):
            fired_seen.setdefault(_schedule_of(job_id), set()).add(job_id)
        row = rows[kind.name]
        row.enqueued += 1
        replays = ledger.replays.get(job_id, [])
        row.replays += len(replays)
        deaths = sum(1 for r in runs if is_lost(r, kind, died, abrupt) == LOST)
        row.lost_runs += deaths
        dead_at = min((_entry_time(d) for d in dead), default=None)
        lost_outcomes: Counter = Counter()  # why runs that ended had their outcome lost, by reason
        unsettled = 0  # runs the job ran again after, unexplained but for such a lost outcome
        successes_lost = True  # every success's outcome lost: the engine never heard of one (see below)
        for i, run in enumerate(runs):
            after = runs[i + 1] if i + 1 < len(runs) else None
            until = after.started if after is not None else dead_at
            if run.ended is None and run.pid in ev.ledger.exits and not kind.hang:
                flag("no end in a clean stop", f"run {run.run_id} has no end, yet its process {run.pid} stopped "
                                               "cleanly: a clean stop finishes or gives up what it runs")
            ended = run.ended if run.ended is not None else timed_out(run, kind, died, abrupt)
            why = outcome_lost(run, until, died, abrupt, ev.cut_off, ended) if until is not None else None
            if run.outcome == OK and why is None:
                successes_lost = False
            if ended is None or until is None:
                continue
            if why is not None:
                lost_outcomes[why] += 1
            # a failed run's retry (the next attempt) or a replay is explained by the outcome itself; a run after a
            # success, or the same attempt again, only by an outcome that never reached Redis
            if after is None or (run.outcome != OK and after.attempt != run.attempt):
                continue
            if why is not None:
                unsettled += 1
            elif run.outcome == OK:
                flag("ran after success", f"run {run.run_id} succeeded at {ended:.3f} and the job ran again at "
                                          f"{after.started:.3f}, with no death or lost contact of its process "
                                          "in between to lose that success")
            else:
                flag("rerun without a lost outcome", f"run {run.run_id} ended {run.outcome or 'by its timeout'} at "
                                                     f"{ended:.3f} and "
                                                     f"the job ran again as the same attempt {run.attempt}, with no "
                                                     "death or lost contact of its process in between")
        row.unsettled += unsettled
        row.max_runs = max(row.max_runs, len(runs))
        succeeded = any(r.outcome == OK for r in runs)

        if succeeded:
            row.succeeded += 1
        for d in dead:
            row.dead[d.reason] += 1

        # A success whose outcome was lost (its process died, or lost contact, before the settle) never reached
        # Redis: the job ran again, at least once, and may then end dead by the rules below.
        if succeeded and dead and not successes_lost:
            flag("succeeded and dead", "the ledger shows a successful run, yet the job is in the dead-letter queue")
        elif not succeeded and not dead:
            flag("unaccounted", "neither succeeded nor dead-lettered after the drain")
        if len(dead) > 1:
            flag("dead twice", f"{len(dead)} dead-letter entries for one job")

        if replays and len(runs) < 1 + len(replays) and not any(d.reason == "panic" for d in dead):
            flag("replay not run", f"replayed {len(replays)} time(s) but ran only {len(runs)} time(s): each replay "
                                   "must give the job a new run")

        uncharged = sum(1 for i, r in enumerate(runs) if is_lost(r, kind, died, abrupt) == LOST
                        and any(later.attempt == r.attempt for later in runs[i + 1:]))
        allowed = _allowed_runs(kind, replays, deaths, unsettled, uncharged)
        if len(runs) > allowed:
            flag("over budget", f"ran {len(runs)} times; its budget of {kind.budget}, {len(replays)} replay(s), "
                                f"{deaths} run(s) lost with their process and {unsettled} lost outcome(s) allow "
                                f"{allowed}")
        for first, later in at_once(runs, kind, died, abrupt, ev.cut_off)[:1]:
            flag("ran twice at once", f"run {later.run_id} (pid {later.pid}) started at {later.started:.3f} while "
                                      f"run {first.run_id} (pid {first.pid}) was under way, and no network fault "
                                      "had cut that process off")
        missing = missing_attempts(runs, kind, replays, dead) if runs else []
        at_death = [n for n in missing
                    if _died_between(died, abrupt,
                                     *_attempt_window(runs, n, ledger.enqueued_at.get(job_id, 0.0), dead_at))]
        if at_death:
            flag("charged before its first line", f"attempt(s) {', '.join(map(str, at_death))} were charged, and no "
                                                  "run of the ledger carries them, but a worker process died while "
                                                  "they were due: one died after the engine marked the run started "
                                                  "and before the task's first line")
        if len(at_death) < len(missing):
            flag("attempt without a run", f"attempt(s) {', '.join(str(n) for n in missing if n not in at_death)} were "
                                          "charged, but no run of the ledger carries them, and no worker process "
                                          "died while they were due")

        if kind.expect == "dead" and succeeded:
            flag("unexpected success", f"a {kind.name} job must end dead ({kind.reason})")
        charged = charged_deaths(runs, kind, died, abrupt)
        if charged > POISON_PILL_DEATHS * (1 + len(replays)):
            flag("past the poison-pill limit", f"lost {charged} charged runs with their processes: a job in flight "
                                               f"at {POISON_PILL_DEATHS} deaths must be dead-lettered as panic "
                                               "instead of killing another worker")
        for d in dead:
            if d.reason == "panic":
                if deaths < POISON_PILL_DEATHS:
                    _blame(flag, deaths, lost_outcomes, POISON_PILL_DEATHS, "false panic",
                           "dead-lettered as panic, but the ledger shows {deaths} run(s) lost with their process: "
                           "a poison pill must have been running at two process deaths")
            elif d.reason == "retries_exhausted" and d.error_class.endswith(WORKER_LOST):
                if not deaths and not at_death:  # a run lost before its first line (noted above) is one too
                    _blame(flag, deaths, lost_outcomes, 1, "false worker lost",
                           "its budget was spent by a run lost with its worker, but the ledger shows no run lost "
                           "with its process")
            elif d.reason == "retries_exhausted" and d.error_class.endswith(LOST_CONTACT):
                # its budget was spent by a run whose worker was cut off from Redis past the visibility timeout:
                # right for any kind, if one of its runs was under way while the workers were cut off
                # until its next run, or its dead-letter entry: a run past its timeout is under way till settled
                spans = [(run.started, later.started) for run, later in zip(runs, runs[1:], strict=False)]
                if runs:
                    spans.append((runs[-1].started, _entry_time(d)))
                if not any(start <= until and end >= since for since, until in spans for start, end in ev.cut_off):
                    flag("false lost contact", "its budget was spent by a run its worker lost contact with, but "
                                               "no run of it was under way while the workers were cut off from Redis")
            elif kind.expect != "dead" or d.reason != kind.reason:
                expected = f"reason {kind.reason}" if kind.expect == "dead" else "to succeed"
                flag("wrong reason", f"dead-lettered as {d.reason} ({d.error_class}); a {kind.name} job is "
                                     f"expected {expected}")
            elif kind.error_class_suffix and not d.error_class.endswith(kind.error_class_suffix):
                flag("wrong error", f"last error {d.error_class!r}; a {kind.name} job must be charged an error "
                                    f"whose class ends with {kind.error_class_suffix}")
            if d.reason in ("retries_exhausted", "unrecoverable") and not runs:
                flag("dead without a run", f"dead-lettered as {d.reason}, but the ledger shows no run")

        if ev.results is not None:
            status = ev.results.get(job_id)
            if succeeded and not dead and status != SUCCESSFUL:
                flag("result", f"the ledger shows a success but get_result() says {status or 'nothing'}")
            elif dead and not succeeded and status != FAILED:
                flag("result", f"dead-lettered as {dead[0].reason} ({dead[0].error_class}) but get_result() says "
                               f"{status or 'nothing'}")

    for name, fired in sorted(ev.schedule_fires.items()):
        # A leader that added a due time's job and lost its lock (killed, cut off) before recording the fire
        # leaves it to the next leader, whose misfire policy may count that due time missed: a job for a due
        # time counted missed is that, never a recorded fire without its job, nor a due time never planned.
        seen = len(fired_seen.get(name, ()))
        missed = ev.schedule_missed.get(name, 0)
        if seen < fired or seen > fired + missed:
            problems.append(f"schedule {name}: the scheduler recorded {fired} fire(s) and {missed} missed due "
                            f"time(s), the ledger and the dead-letter queue account for {seen} fire(s)")
    for queue, left in sorted(ev.leftovers.items()):
        if any(left.values()):
            problems.append(f"queue {queue} not drained: " + ", ".join(f"{k} {v}" for k, v in left.items() if v))
    for kind in ev.kinds.values():
        if kind.concurrency:
            ended = [r for kind_runs in ledger.runs.values() for r in kind_runs
                     if r.kind == kind.name and r.ended is not None]
            most = most_at_once(ended)
            if most > kind.concurrency:
                problems.append(f"{kind.name}: {most} runs were under way at once; its concurrency limit is "
                                f"{kind.concurrency}")
        if kind.rate:
            starts = sorted(r.started for kind_runs in ledger.runs.values() for r in kind_runs if r.kind == kind.name)
            crowded = most_in_a_second(starts)
            if crowded > kind.rate:
                problems.append(f"{kind.name}: {crowded} runs started within one second; its rate limit is "
                                f"{kind.rate} a second")
    if ev.flows is not None:  # the workflows' rules: verdict_flows.py
        flow_found, flow_problems = judge_flows(ev.flows, ledger, set(dead_by_job))
        found += [Discrepancy(f.what, f.job_id, f.kind, f.detail) for f in flow_found]
        problems += flow_problems
    for text in ledger.torn:
        problems.append(f"a ledger line is not a whole record: {text!r}")
    for rec in ledger.orphan_ends:
        problems.append(f"a ledger end line has no start line: {rec!r}")
    return Verdict(rows, found, problems, notes)
