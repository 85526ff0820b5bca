"""``python -m bench soak [--minutes N] [--seed S] [--contention N] [--network-faults] [--without KIND ...]``.

The whole soak, start to verdict. The seed (drawn for the run when none is
given) is printed first: the same seed gives the same workload and fault
timeline.

1. Start a private redis-server (AOF on) and set up Django on the soak's
   settings (its own SQLite file, its own tasks app).
2. Start ``--contention`` busy processes, and with ``--network-faults`` the
   fault proxy the workers reach Redis through; start ``runworker soak-a
   soak-b soak-c --processes 2`` and wait for its two worker processes.
3. For ``--minutes``: the producer thread enqueues the workload and replays
   dead jobs, while this thread injects the faults of the timeline.
4. Drain: stop producing, pause the schedules, replay what still waits for
   a replay, and wait (up to ``--drain-timeout``) until no stream, delayed
   set or pending list holds anything.
5. Stop the supervisor with SIGTERM (it must exit 0), read the dead-letter
   queues, the stored results and the ledger, and judge (verdict.py). The
   busy processes and the proxy stop whatever happened.

Exit status: 0 when every job is accounted for, 1 on any discrepancy, 2
when the soak itself could not run (no redis-server, a kind this Chasqui
cannot run).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

from .kinds import KINDS, QUEUES, SCHEDULES, without

SETTINGS = "bench.soak.settings"
START_TIMEOUT = 120.0
"""Seconds the first worker processes may take to start (Django on a busy machine)."""
MAX_CONTENTION = 64
"""Most busy processes ``--contention`` starts."""


def parse(argv: list[str]) -> argparse.Namespace:
    names = [k.name for k in KINDS]
    parser = argparse.ArgumentParser(
        prog="python -m bench soak",
        description="Accounting soak: a mixed workload under injected faults; every job accounted for at the end "
                    "against a ledger kept outside Redis. Exits 1 on any discrepancy.")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of workload and faults (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the workload and the fault timeline")
    parser.add_argument("--rate", type=float, default=15.0, help="jobs enqueued per second (default 15)")
    parser.add_argument("--concurrency", type=int, default=8, help="runworker --concurrency (default 8)")
    parser.add_argument("--processes", type=int, default=2, help="runworker --processes (default 2)")
    parser.add_argument("--visibility-timeout", type=int, default=5000,
                        help="runworker --visibility-timeout in ms (default 5000: crashes recover within the run)")
    parser.add_argument("--fault-every", type=float, default=12.0, help="seconds between two faults (default 12)")
    parser.add_argument("--no-faults", action="store_true", help="run the workload without injecting faults")
    parser.add_argument("--contention", type=int, default=0, metavar="N",
                        help="start N busy processes beside the soak, as on a loaded host (default 0)")
    parser.add_argument("--network-faults", action="store_true",
                        help="workers reach Redis through a fault proxy; add latency, blackholes and refusals past "
                             "the visibility timeout, resets and half-open links to the faults")
    parser.add_argument("--drain-timeout", type=float, default=120.0,
                        help="seconds the drain may take before leftovers count as discrepancies (default 120)")
    parser.add_argument("--without", action="append", default=[], metavar="KIND",
                        choices=[*names, "hang", "flows"],
                        help="leave a job kind out ('hang' for both hanging kinds, which need @task(timeout=...), "
                             "'flows' for every workflow kind); repeatable")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (ledger, logs, AOF)")
    parser.add_argument("--judge", metavar="DIR", default=None,
                        help="run nothing: judge again the evidence a kept run left in DIR, with this verdict")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes must be above 0, got {args.minutes}")
    if not 0 <= args.contention <= MAX_CONTENTION:
        parser.error(f"--contention must be between 0 and {MAX_CONTENTION}, got {args.contention}")
    args.drawn = args.seed is None
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)  # not the global generator: a new seed every run
    return args


def announce(args: argparse.Namespace) -> str:
    """The soak's first line: its seed, and how to run it again."""
    how = "drawn for this run" if args.drawn else "given"
    return f"soak: seed {args.seed} ({how}; run it again with --seed {args.seed})"


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.judge is not None:
        return judge_again(args.judge)
    say(announce(args))
    kinds = without(set(args.without))
    workdir = tempfile.mkdtemp(prefix="chasqui-soak-")
    from .server import SoakServer

    try:
        server = SoakServer(os.path.join(workdir, "redis"))
        server.start()
    except RuntimeError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    try:
        code = _soak(args, kinds, server, workdir)
    except _CannotRun as exc:
        print(f"soak: {exc}", file=sys.stderr)
        code = 2
    finally:
        server.stop()
    nothing_ran = not os.path.exists(os.path.join(workdir, "workers.log"))
    if (code == 0 or nothing_ran) and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"The run's ledger, evidence, worker log and Redis data are in {workdir} "
            f"(judge it again: python -m bench soak --judge {workdir})")
    return code


def judge_again(directory: str) -> int:
    """The table and the discrepancies of a kept run, judged again from its ``evidence.json`` and ledgers."""
    from .record import load
    from .verdict import judge
    from .verdict_report import report_discrepancies, report_notes, table

    try:
        verdict = judge(load(directory))
    except FileNotFoundError as exc:
        print(f"soak: {exc.filename}: no evidence there (a run keeps it with --keep, or when it fails)",
              file=sys.stderr)
        return 2
    say(table(verdict, [k.name for k in KINDS]))
    if verdict.notes:
        say("\n" + report_notes(verdict))
    if not verdict.ok:
        say("\n" + report_discrepancies(verdict))
    counts = ", ".join(f"{what} {n}" for what, n in sorted(verdict.counts().items()))
    say(f"\nsoak --judge: {'PASS' if verdict.ok else 'FAIL'}: {len(verdict.discrepancies) + len(verdict.problems)} "
        f"discrepancies" + (f" ({counts})" if counts else ""))
    return 0 if verdict.ok else 1


class _CannotRun(Exception):
    pass


def _environment(server, workdir: str) -> dict[str, str]:
    from ..child import ROOT
    from .tasks import FIXED_ENV, LEDGER_ENV

    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "REDIS_URL": server.url,
        "DATABASE_URL": f"sqlite:///{os.path.join(workdir, 'soak.sqlite3')}",
        LEDGER_ENV: os.path.join(workdir, "ledger.jsonl"),
        FIXED_ENV: os.path.join(workdir, "fixed"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    })
    env.pop("CHASQUI_SIGNING_KEYS", None)
    return env


def _soak(args, kinds, server, workdir: str) -> int:
    # the settings read these at import: set them before Django starts in this process
    os.environ.update({"DJANGO_SETTINGS_MODULE": SETTINGS, "REDIS_URL": server.url,
                       "DATABASE_URL": f"sqlite:///{os.path.join(workdir, 'soak.sqlite3')}"})
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)  # as a deployment would: the workers read its tables
    from . import tasks

    if any(k.hang for k in kinds) and not tasks.SUPPORTS_TIMEOUT:
        raise _CannotRun("the hang kinds need @task(timeout=...), which this Chasqui does not have yet; "
                         "run with --without hang")
    from ..faultproxy import FaultProxy
    from .contention import Contention

    # bounded by the whole run, so no busy process outlives a soak that was itself killed
    busy = Contention(args.contention, lifetime=START_TIMEOUT + args.minutes * 60 + args.drain_timeout + 300)
    proxy = FaultProxy(server.port) if args.network_faults else None
    try:  # whatever happens, no worker process, busy process or proxy outlives the soak
        if proxy is not None:
            proxy.start()
        busy.start()
        soak = Soak(args, kinds, server, workdir, tasks, proxy)
        soak.supervisor.start()
        try:
            soak.workload()
            soak.drain()
            verdict = soak.account()
            soak.report(verdict)
            return 0 if verdict.ok else 1
        finally:
            soak.supervisor.stop()
    finally:
        busy.stop()
        if proxy is not None:
            proxy.stop()


class Soak:
    """One run, phase by phase: ``workload``, ``drain``, ``account``, ``report``."""

    def __init__(self, args, kinds, server, workdir: str, tasks, proxy=None) -> None:
        from chasqui_core.engine.store.connection import connect

        from .faults import Injector, Watcher, plan
        from .ledger import LedgerWriter
        from .producer import Producer
        from .workers import WorkerSupervisor

        self.args, self.kinds, self.server, self.tasks = args, kinds, server, tasks
        self.workdir = workdir
        self.env = _environment(server, workdir)
        self.proxy = proxy
        if proxy is not None:
            self.env["REDIS_URL"] = proxy.url  # the workers only; the producer and the accounting go direct
        os.makedirs(self.env[tasks.FIXED_ENV], exist_ok=True)
        self.producer_ledger = os.path.join(workdir, "producer.jsonl")
        self.seconds = args.minutes * 60
        self.queues = list(QUEUES)
        self.client = connect(server.url)
        rng = random.Random(args.seed)
        self.supervisor = WorkerSupervisor(self.queues, env=self.env, log_path=os.path.join(workdir, "workers.log"),
                                           processes=args.processes, concurrency=args.concurrency,
                                           visibility_timeout_ms=args.visibility_timeout)
        self.watcher = Watcher(self.supervisor)
        faults = [] if args.no_faults else plan(self.seconds, rng, every=args.fault_every,
                                                 network=args.network_faults)
        self.injector = Injector(faults, self.supervisor, server, self._client, self.queues, rng, say, proxy=proxy,
                                 visibility_timeout=args.visibility_timeout / 1000)
        self.ledger = LedgerWriter(self.producer_ledger)
        self.producer = Producer(kinds, tasks, self.ledger, self._client, self.queues, random.Random(rng.random()),
                                 args.rate, self.env[tasks.FIXED_ENV], say)
        self.problems: list[str] = []
        """Discrepancies of the run itself (the supervisor exiting on its own, enqueues that never landed)."""
        self.leftovers: dict[str, dict[str, int]] = {}
        self.fired: dict[str, int] = {}
        self.missed: dict[str, int] = {}
        self.drain_wall = 0.0
        self.clean_exits = 0

    def _client(self):
        return self.client

    def workload(self) -> None:
        """Start the workers, then produce and inject faults for ``--minutes``."""
        args = self.args
        say(f"Soak: {args.minutes:g} min, seed {args.seed}, {args.rate:g} jobs/s, kinds "
            f"{', '.join(k.name for k in self.kinds)}; {self.server.version()} on port {self.server.port} "
            "(AOF, fsync always)"
            + (f"; workers through the fault proxy on port {self.proxy.port}" if self.proxy is not None else "")
            + (f"; {args.contention} busy process(es) beside it" if args.contention else ""))
        if len(self.supervisor.wait_for_children(args.processes, START_TIMEOUT)) < args.processes:
            raise _CannotRun(f"runworker did not start {args.processes} worker processes within "
                             f"{START_TIMEOUT:.0f} s; see {self.supervisor.log_path}")
        self.watcher.start()
        began = time.monotonic()
        self.producer.start()
        say(f"Workload and faults for {self.seconds:.0f} s ({len(self.injector.plan)} faults planned):")
        while (elapsed := time.monotonic() - began) < self.seconds:
            self.injector.due(elapsed)
            code = self.supervisor.exited()
            if code is not None:
                self.problems.append(f"the supervisor exited by itself with code {code} at {elapsed:.1f} s; "
                                     "started again")
                self.supervisor.start()
            time.sleep(0.1)
        self.producer.stop()
        self.injector.finish(time.monotonic() - began)

    def drain(self) -> None:
        """Pause the schedules, wait until nothing is left anywhere, then stop the workers (they must exit 0)."""
        from chasqui_core.engine.store.keys import schedule_state
        from chasqui_core.engine.timing.scheduler import set_paused

        from .producer import leftovers

        say(f"Drain: {self.producer.made}+ jobs enqueued, {self.producer.replays} replays so far; "
            f"waiting up to {self.args.drain_timeout:.0f} s for every queue to empty")
        for name in SCHEDULES:
            _retrying(lambda name=name: set_paused(self.client, name, "soak"))
        began, self.drain_wall = time.monotonic(), time.time()
        self.leftovers = _drain(self.client, self.queues, self.producer, self.args.drain_timeout, leftovers)
        if any(any(v.values()) for v in self.leftovers.values()):
            say(f"Not drained after {self.args.drain_timeout:.0f} s: {self.leftovers}")
        else:
            say(f"Drained in {time.monotonic() - began:.1f} s")
        unsent = self.producer.flush_retries()
        if unsent:
            self.problems.append(f"{unsent} enqueue(s) never succeeded, even after the drain")
        for name in SCHEDULES:
            fired, missed = _retrying(lambda name=name: self.client.hmget(schedule_state(name), "fired", "missed"))
            self.fired[name] = int(fired or 0)
            self.missed[name] = int(missed or 0)
        code = self.supervisor.stop()
        if code != 0:
            self.problems.append(f"the supervisor exited with code {code} on SIGTERM (expected 0)")
        self.watcher.stop()
        self.ledger.close()

    def account(self):
        """Read the dead-letter queues, the results and the ledger, and judge every job."""
        from .ledger import read as read_ledger
        from .producer import flow_evidence, read_dlq
        from .record import save
        from .verdict import Evidence, judge

        dead = [entry for queue in self.queues for entry in read_dlq(self.client, queue)]
        ledger = read_ledger([self.env[self.tasks.LEDGER_ENV], self.producer_ledger])
        results = _results(set(ledger.enqueued) | set(ledger.runs) | {d.job_id for d in dead})
        ledger_pids = {r.pid for runs in ledger.runs.values() for r in runs}
        self.clean_exits = len(ledger.exits)
        evidence = Evidence(ledger, {k.name: k for k in self.kinds}, dead, self.watcher.dead_pids(ledger_pids),
                            self.injector.killed, results, self.leftovers, self.fired, self.injector.cut_off,
                            schedule_missed=self.missed,
                            flows=flow_evidence(self.client, self.workdir))
        save(self.workdir, evidence)
        verdict = judge(evidence)
        verdict.problems[:0] = self.problems
        return verdict

    def report(self, verdict) -> None:
        """The faults, the table, the offenders, and one summary line."""
        from .verdict_report import report_discrepancies, report_notes, table

        say("\nFaults injected:")
        for f in self.injector.done:
            say(f"  {f.at:6.1f} s  {f.fault:<16} {f.detail}")
        if not self.injector.done:
            say("  none")
        died = sum(1 for t in self.watcher.died.values() if t < self.drain_wall)
        say(f"  worker processes seen: {len(self.watcher.seen)}, of which died before the drain: {died}, "
            f"killed by the soak: {len(self.injector.killed)}, stopped cleanly (exit line in the ledger): "
            f"{self.clean_exits}")
        if self.args.network_faults:
            cut = sum(end - start for start, end in self.injector.cut_off)
            say(f"  workers cut off from Redis {len(self.injector.cut_off)} time(s), {cut:.0f} s in all")
        say("\n" + table(verdict, [k.name for k in KINDS]))
        counts = verdict.counts()
        if counts:
            say("\nDiscrepancies by kind:\n" + "\n".join(f"  {what:<32} {n}" for what, n in sorted(counts.items())))
        if verdict.notes:
            say("\n" + report_notes(verdict))
        if not verdict.ok:
            say("\n" + report_discrepancies(verdict))
        jobs = sum(r.enqueued for r in verdict.rows.values())
        found = len(verdict.discrepancies) + len(verdict.problems)
        kinds = [f"{what} {n}" for what, n in sorted(verdict.counts().items())]
        if verdict.problems:
            kinds.append(f"other {len(verdict.problems)}")
        conditions = (f", contention {self.args.contention}" if self.args.contention else "") + (
            ", network faults" if self.args.network_faults else "")
        say(f"\nsoak: {'PASS' if verdict.ok else 'FAIL'}: {self.args.minutes:g} min, seed {self.args.seed}"
            f"{conditions}, "
            f"{jobs:,} jobs, {self.producer.replays} replays, {len(self.injector.done)} faults, "
            f"{found} discrepancies" + (f" ({', '.join(kinds)})" if kinds else ""))


def _retrying(call, attempts: int = 50):
    """A call to Redis that may meet it restarting: tried again for a few seconds."""
    import redis

    for i in range(attempts):
        try:
            return call()
        except redis.ConnectionError:
            if i == attempts - 1:
                raise
            time.sleep(0.1)


def _drain(client, queues, producer, timeout: float, leftovers):
    """Replay what waits for a replay and wait until nothing is left anywhere (twice in a row, a second apart)."""
    deadline = time.monotonic() + timeout
    empty_in_a_row = 0
    while True:
        producer.flush_retries()
        producer.replay_round(final=True)
        left = _retrying(lambda: leftovers(client, queues))
        empty = not any(any(v.values()) for v in left.values())
        empty_in_a_row = empty_in_a_row + 1 if empty else 0
        if empty_in_a_row >= 2 or time.monotonic() > deadline:
            return left
        time.sleep(1.0 if empty else 0.5)


def _results(job_ids: set[str]) -> dict[str, str | None]:
    """Each job's stored result status, as ``get_result()`` gives it (None: no result)."""
    from django.tasks import default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist

    out: dict[str, str | None] = {}
    for job_id in job_ids:
        try:
            status = default_task_backend.get_result(job_id).status
            out[job_id] = getattr(status, "value", str(status))
        except TaskResultDoesNotExist:
            out[job_id] = None
    return out
