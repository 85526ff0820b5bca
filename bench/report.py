"""Showing a run: progress lines, the results table, JSON, and docs/benchmarks.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, UTC

from .machine import describe
from .page_sections import CONSOLE, COSTS, SYNC_SPEED
from .results import RATE, Measurement

DASH = "—"
PEERS = ("rq", "arq")
PEER_NAMES = {"rq": "RQ", "arq": "arq"}
COLUMNS = ("Scenario", "Chasqui (median)", "of Redis ceiling", "of engine twin", "RQ", "arq",
           "Reference engine (published)", "Goal")

REFERENCE_MACHINE = "Rust engine, 8-core Apple M3, Redis 8.6 on loopback"


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return DASH
    if unit == "ms":
        number = f"{value:.2f}" if value < 10 else f"{value:,.1f}"
    elif unit in ("µs", "MB"):
        number = f"{value:,.1f}"
    else:
        number = f"{value:,.0f}"
    return f"{number} {unit}"


def twin_fraction(m: Measurement | None, twin: Measurement | None) -> str | None:
    """``0.85 of worker-concurrent (CPU per job ×1.20)``: a Django-path row against the engine row it mirrors.

    Worker rows also compare CPU time per job, which a busy machine disturbs far less than the rates.
    """
    if m is None or twin is None or not m.median or not twin.median or m.system != "chasqui":
        return None
    text = f"{m.median / twin.median:.2f} of {twin.label}"
    if m.cpu_us_per_job and twin.cpu_us_per_job:
        text += f" (CPU per job ×{m.cpu_us_per_job / twin.cpu_us_per_job:.2f})"
    return text


def line(m: Measurement, ceiling: float | None, twin: Measurement | None = None) -> str:
    who = "" if m.system == "chasqui" else f" [{PEER_NAMES.get(m.system, m.system)}]"
    if m.skipped:
        return f"   {m.label}{who}: {m.skipped}"
    text = f"   {m.label + who:<52} {fmt(m.median, m.unit):>16}"
    if m.is_rate and ceiling and m.scenario != "ceiling":
        text += f"   {m.median / ceiling:5.3f} of ceiling"
    if twin_fraction(m, twin):
        text += f"   {twin_fraction(m, twin)}"
    if len(m.samples) > 1:
        text += "   repeats: " + ", ".join(fmt(s, m.unit).rsplit(" ", 1)[0] for s in m.samples)
    if m.note:
        text += f"\n   {'':<52} {m.note}"
    return text


# --- the table ---------------------------------------------------------------------------------


def _peer_cell(peer: Measurement | None, ours: Measurement | None) -> str:
    if peer is None:
        return DASH
    if peer.skipped:
        return "skipped"
    cell = fmt(peer.median, peer.unit)
    if ours is not None and ours.median and peer.median:
        cell += f" (Chasqui ×{ours.median / peer.median:,.1f})"
    return cell


def _ours_cell(o: Measurement | None) -> str:
    if o is None:
        return DASH
    return "skipped" if o.skipped else fmt(o.median, o.unit)


def rows(run) -> list[tuple[str, ...]]:
    from .scenarios import goal, twin

    ceiling = run.ceiling
    order: list[str] = []
    ours: dict[str, Measurement] = {}
    peers: dict[tuple[str, str], Measurement] = {}
    top = None
    for m in run.measurements:
        if m.scenario == "ceiling":
            top = m
            continue
        if m.label not in order:
            order.append(m.label)
        if m.system == "chasqui":
            ours[m.label] = m
        else:
            peers[(m.label, m.system)] = m
    out = []
    if top is not None:
        out.append((top.label, fmt(top.median, top.unit), "1.00", DASH, DASH, DASH, DASH, DASH))
    for label in order:
        o = ours.get(label)
        g = goal(label)
        fraction = f"{o.median / ceiling:.3f}" if o and o.is_rate and o.median and ceiling else DASH
        twin_label = twin(label)
        of_twin = twin_fraction(o, ours.get(twin_label)) if twin_label else None
        if twin_label and of_twin is None:
            of_twin = f"— ({twin_label} not in this run)" if twin_label not in ours else DASH
        out.append((
            label, _ours_cell(o), fraction, of_twin or DASH,
            *(_peer_cell(peers.get((label, p)), o) for p in PEERS),
            g.reference or DASH, g.target or DASH,
        ))
    return out


def table(run) -> str:
    body = rows(run)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(COLUMNS)]
    sep = "  "
    lines = [sep.join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=False)), sep.join("-" * w for w in widths)]
    for r in body:
        lines.append(sep.join(c.ljust(w) for c, w in zip(r, widths, strict=False)))
    return "\n".join(lines)


# --- goals against what the run allowed -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reach:
    """A rate goal beside the most its scenario could reach in this run (see ``scenarios.Limit``)."""

    label: str
    target: str
    at_least: float
    measured: float
    most: float
    bound_by: str
    share: float
    why: str

    @property
    def within_reach(self) -> bool:
        return self.most >= self.at_least


def reaches(run) -> list[Reach]:
    """Each rate goal with a limit whose rows are both in the run, in the order of the run."""
    from .scenarios import goal

    rates = {m.label: m.median for m in run.measurements if m.system == "chasqui" and m.is_rate and m.median}
    out = []
    for label, measured in rates.items():
        g = goal(label)
        if g.limit is None or g.limit.label not in rates:
            continue
        most = rates[g.limit.label] * g.limit.share
        out.append(Reach(label, g.target, g.at_least, measured, most, g.limit.label, g.limit.share, g.limit.why))
    return out


def _reach_line(r: Reach) -> str:
    bound = f"`{r.bound_by}`" if r.share == 1 else f"{r.share:g} of `{r.bound_by}`"
    if r.measured >= r.at_least:
        verdict = "met"
    else:
        verdict = "not met, within reach" if r.within_reach else "out of reach on this host in this run"
    return (f"- `{r.label}` (goal {r.target}): {fmt(r.at_least, RATE)} asked, {fmt(r.measured, RATE)} measured, "
            f"{verdict}. The most here is about {fmt(r.most, RATE)}, {bound} ({r.why}); it reached "
            f"{r.measured / r.most:.2f} of that.")


def reach_lines(run) -> str:
    """The goals-against-bounds lines, for the terminal after the table."""
    return "\n".join(map(_reach_line, reaches(run)))


# --- JSON --------------------------------------------------------------------------------------


def to_json(run) -> dict:
    from .scenarios import goal, twin

    ours = {m.label: m for m in run.measurements if m.system == "chasqui" and m.samples}
    limits = {r.label: r for r in reaches(run)}
    items = []
    for m in run.measurements:
        d = m.to_dict()
        if m.is_rate and m.median and run.ceiling:
            d["fraction_of_ceiling"] = m.median / run.ceiling
        g = goal(m.label)
        d["goal"], d["reference"] = g.target or None, g.reference or None
        reach = limits.get(m.label) if m.system == "chasqui" else None
        if reach is not None:
            d["goal_limit"] = {"bound_by": reach.bound_by, "share": reach.share, "most": reach.most,
                               "within_reach": reach.within_reach}
        mine = ours.get(m.label)
        if m.system != "chasqui" and mine is not None and m.median:
            d["chasqui_ratio"] = mine.median / m.median
        twin_label = twin(m.label) if m.system == "chasqui" else None
        if twin_label:
            d["engine_twin"] = twin_label
            other = ours.get(twin_label)
            d["fraction_of_twin"] = m.median / other.median if other is not None and m.median else None
            d["cpu_per_job_of_twin"] = (m.cpu_us_per_job / other.cpu_us_per_job
                                        if other is not None and m.cpu_us_per_job and other.cpu_us_per_job else None)
        items.append(d)
    return {
        "command": run.command,
        "started_at": datetime.fromtimestamp(run.started_at, UTC).isoformat(timespec="seconds"),
        "seconds": round(run.seconds, 1),
        "smoke": run.smoke,
        "repeats": run.repeats,
        "machine": run.machine,
        "server": run.server,
        "ceiling_jobs_per_s": run.ceiling,
        "measurements": items,
        "failures": run.failures,
    }


def write_json(run, path: str) -> None:
    with open(path, "w") as f:
        json.dump(to_json(run), f, indent=2, ensure_ascii=False)
        f.write("\n")


# --- docs/benchmarks.md --------------------------------------------------------------------------

_METHOD = """\
## How it measures

- **One command.** `python -m bench --all --markdown docs/benchmarks.md` ran every scenario and wrote this
  page; `python -m bench worker-concurrent latency` runs a selection, `--json out.json` saves the numbers,
  `--repeats N` changes the number of measured repeats, `--smoke` runs tiny sizes once (CI does, to prove the
  suite works; its numbers mean little). `make bench ARGS="..."` does the same.
- **Server.** By default a private Valkey server started for the run, append-only file **off** (benchmarks
  measure the queue, not the disk; the development server keeps it on). With `REDIS_URL` set, that server is
  used; it must be an empty database, since every scenario starts with `FLUSHDB` (or pass `--flush`).
- **Empty start, warm-up, median.** Every scenario empties the database, runs a warm-up that is not
  counted, then measures. A rate is the jobs of the measured window divided by that window's seconds, never
  warm-up plus measured jobs over the measured time. The table shows the median of the repeats.
- **Redis ceiling.** In the same run, the rate of bare pipelined `XADD`s (pre-encoded, pipelines of 1,000, one
  connection) of a job-sized entry. Every job costs the server at least one stream write, so no client on this
  machine can beat it; each rate is also shown as a fraction of it, which travels better between machines.
- **Workers.** The engine's real `Worker`, every feature on: retries with backoff, events and counters,
  heartbeats, lease renewal, crash recovery, the promoter. The backlog is loaded before the worker process
  starts; the window opens when the first handler starts and closes when the last job's outcome is
  acknowledged in Redis. After each drain the worker is stopped cleanly and the queue is checked: nothing may
  be left in the stream, the pending list, the delayed set or the DLQ.
- **The Django path.** The same work as a Django user does it, in the same run, each row next to the engine
  row it mirrors (its *engine twin*, same handler kind, concurrency and backlog size): `django-enqueue` is
  `queue-add` through `@task(...).enqueue()` (measured in turns with a `Queue.add` loop, a block of 1,000
  calls each, so that both see the same machine: its twin is that loop's row), `django-enqueue-many` is
  `queue-add-bulk` through `task.enqueue_many()` (in turns with `Queue.add_bulk`, a chunk of 1,000 each; its
  twin is that row), and the `runworker-*` rows are the worker rows run by the real
  `python manage.py runworker <queue> --concurrency N`, a fresh process per drain, each drain taking turns
  with a drain of its engine twin by one engine worker process (the twin's row is `<twin> (beside <scenario>)`),
  on the bench's settings
  (`bench/django_settings.py`: the project's settings plus the bench's tasks app, `bench/tasks.py`; DEBUG off,
  the project's own logging, every Django signal receiver running). Django's start-up is
  not throughput: the window opens when the first task starts (it writes the time to Redis) and closes when
  the last job's outcome is acknowledged in Redis; the process is then stopped with SIGTERM and must exit
  cleanly, and the queue is checked as for the engine rows. The worker's CPU time per job is given too.
- **Latency.** Producer and worker in separate processes. The producer stamps `time.time_ns()` into each job
  right before adding it, at a steady rate; the handler subtracts it from its own clock when it starts. Rates:
  500 jobs/s, and half of saturation: the rate at which the worker starts jobs while the producer adds them
  as fast as it can (measured first, with the same two processes, so it is what this pair sustains on this
  machine).
- **Peers.** RQ and arq on the same server in the same run, with settings in their favour (results not kept,
  per-job logging off, arq polling every 10 ms instead of 500 ms). Install them with
  `pip install --no-deps -r requirements-bench.txt` (arq 0.28.0 declares `redis<6` but runs on the project's
  redis-py; `--no-deps` keeps pip from downgrading it). "Chasqui ×N" is Chasqui's median divided by the peer's.
- **Profiling.** `python -m bench worker-concurrent --profile DIR` samples every worker process (the
  `runworker` ones included, start-up and all) with py-spy into `DIR/*.speedscope.json` (open them at
  speedscope.app); a profiled run's numbers are not representative. Worker rows also give the worker
  process's CPU time per job, which varies far less than wall-clock rates on a shared machine.
- **Goals are tracked here, never asserted**: a slow or busy machine must not fail a build. A goal given as a
  rate is also set against the most its scenario could reach in the same run, where another row bounds it
  (`bench/scenarios.py`, `Limit`): a retried job runs twice, so worker-retry cannot pass half of the noop
  drain beside it; the promoter writes each job with an `XADD`, so it cannot pass the ceiling; a Django-path
  row runs its engine twin's code and more. The page says which goals were out of reach in the run.
"""

_SCENARIOS = """\
## Scenarios

| Scenario | What it measures |
|---|---|
| `queue-add` | `Queue.add`, one job per call, sync client; in turns with a bare round trip (PING over the same kind of connection), a block of 1,000 calls each: its yardstick `round trip (beside queue-add)` |
| `queue-add-bulk` | `Queue.add_bulk` in chunks of 1,000, building the `JobSpec`s included |
| `queue-add-delayed` | `Queue.add(delay=...)`, one job per call |
| `django-enqueue` | Django `@task(...).enqueue()` in a loop, one job per call, and the time of one call; in turns with `Queue.add`, a block of 1,000 calls each: engine twin `queue-add (beside django-enqueue)` |
| `django-enqueue-many` | Django `task.enqueue_many(calls)`, 1,000 `(args, kwargs)` calls per call, building the list included; in turns with `Queue.add_bulk`, a chunk of 1,000 each: engine twin `queue-add-bulk (beside django-enqueue-many)` |
| `worker-generic` | one worker, concurrency 1, async noop handler |
| `worker-concurrent` | one worker process, concurrency 100, async noop handler |
| `worker-sync` | one worker process, concurrency 10, sync (`def`) noop handler run in threads |
| `worker-retry` | every job fails once, is retried after 1 ms, then succeeds; successes per second; in turns with a `worker-concurrent` drain of the same size by the same worker process: shown against `worker-concurrent (beside worker-retry)` |
| `worker-delayed-e2e` | a backlog preloaded in the delayed set, all due: promoted and consumed; in turns with a `worker-concurrent` drain of the same size: shown against `worker-concurrent (beside worker-delayed-e2e)` |
| `runworker-async` | `python manage.py runworker bench-django --concurrency 100`, async noop task; drain by drain in turns with an engine worker process draining the same backlog: engine twin `worker-concurrent (beside runworker-async)` |
| `runworker-sync` | `python manage.py runworker bench-django --concurrency 10`, sync (`def`) noop task run in threads; drain by drain in turns with an engine worker process draining the same backlog: engine twin `worker-sync (beside runworker-sync)` |
| `runworker-sync-100` | `python manage.py runworker bench-django --concurrency 100`, sync (`def`) noop task run in 100 threads; drain by drain in turns with an engine worker process draining the same backlog with an async noop handler: `worker-concurrent (beside runworker-sync-100)`, the engine drain a sync project is measured against |
| `runworker-retry` | `python manage.py runworker bench-django --concurrency 100`, every job fails once, is retried after 1 ms, then succeeds; successes per second; drain by drain in turns with an engine worker process draining the same backlog: engine twin `worker-retry (beside runworker-retry)` |
| `runworker-signed` | `runworker-async` with `CHASQUI["SIGNING_KEYS"]` set: the backlog signed at enqueue, every job's signature checked by the worker; shown against `runworker-async` of the same run |
| `cluster-drain` | one worker process, concurrency 100, async noop handler, draining 3 queues: on one server, then on a 3-master cluster with one queue per master (both started for the scenario from the same Valkey binary) |
| `promoter` | a delayed set of due jobs drained into the stream by the `Promoter` alone (no worker reading) |
| `latency` | enqueue → handler start, p50 / p99 / p99.9, at 500 jobs/s and at half of saturation |
| `memory` | peak RSS (`VmHWM`, else `ru_maxrss`) of a fresh worker process draining the backlog; alone and with Django set up |
| `dlq-page` | `DeadLetters.page(limit=50)`, the console's DLQ page, on 200,000 and 1,000,000 dead jobs (written by plain XADDs, then indexed as after an upgrade) |
| `console-scale` | the console's DLQ reads on a DLQ built by a worker (a real one for the first 2,000 dead jobs, then `settle.lua` as the settler calls it), `--console-size N` entries (default 1,000,000): the grouped view, a first page of rare filters (task, error class, group, reason, task and reason), filtered counts, and finding a job by id when dead, delayed, waiting and finished (beside 1,000,000 delayed and 100,000 waiting jobs); each row beside issue 29's goal |
| `peers` | RQ and arq, `worker-concurrent`-like and `queue-add-bulk`-like, on the same server |

`python -m bench soak` is not a benchmark but the accounting soak ([reliability.md](reliability.md#all-of-it-at-once-the-accounting-soak)):
a mixed workload under injected faults, every job accounted for at the end. It prints its seed first (drawn
for each run unless `--seed` is given). `--contention N` runs it beside N busy processes, as on a loaded host;
`--network-faults` puts its workers behind the project's TCP fault proxy (`bench/faultproxy.py`: latency,
blackholes and refused connections past the visibility timeout, resets, half-open links). Timing goals are
not its business: it exits 1 on any job it cannot account for.
"""


SMOKE_NOTE = "smoke sizes, 1 repeat: these numbers only prove the suite runs"


def markdown(run) -> str:
    m = run.machine
    s = run.server
    when = datetime.fromtimestamp(run.started_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    server = f"{s['name']} {s['version']}, " + ("embedded (started for the run)" if s["embedded"] else "from REDIS_URL")
    server += f", append-only file {'off' if s['appendonly'] == 'no' else s['appendonly']}, loopback"
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench --all --markdown docs/benchmarks.md`: edit bench/report.py, not this file. -->",
        "",
        f"Measured {when} with `{run.command}` "
        f"({SMOKE_NOTE if run.smoke else f'median of {run.repeats} repeats'}; "
        f"the run took {run.seconds / 60:.1f} min).",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable)",
        f"- Python: {m['python']}; redis-py {m['redis_py']}, hiredis {m['hiredis']}, msgpack {m['msgpack']}",
        f"- Server: {server}",
        f"- OS: {m['os']}",
        f"- Load average when the run started (1, 5, 15 min): {m.get('load_at_start', 'unknown')}; "
        "other processes share the machine, so treat small differences as noise",
        "",
        "## Results",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for r in rows(run):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    out += [
        "",
        f"*of Redis ceiling*: the rate divided by this run's ceiling (first row). *of engine twin*: a Django-path "
        "rate divided by the rate of the engine row it mirrors, in this run (for workers, also the ratio of their "
        "CPU time per job, steadier on a shared machine); for an engine row, the yardstick measured in turns with "
        "it (worker-concurrent for worker-retry and worker-delayed-e2e, a bare round trip for queue-add). "
        "*Reference engine*: its published "
        f"numbers ({REFERENCE_MACHINE}), a different machine, for context. Popular Python queues on Redis (RQ, arq, "
        "SAQ, Celery, Dramatiq) publish 0.2k–13k noop jobs/s per setup. *Goal*: issue 5's (engine) and issue 11's "
        "(Django path) targets for one Python process on a 2-core machine with Redis on loopback.",
        "",
    ]
    goal_lines = reach_lines(run)
    if goal_lines:
        out += [
            "### Goals against what this run allowed",
            "",
            "Some goals are rates set on a faster day of this shared host. Each of these is bounded by another "
            "row of the same run that its scenario cannot outrun, whatever its code does (beyond the noise "
            "between turns), so a goal above that bound says more about the host than about the code:",
            "",
            goal_lines,
            "",
        ]
    out += [
        "### Details per row",
        "",
    ]
    previous = ""
    for meas in run.measurements:
        if meas.note or meas.skipped:
            who = "" if meas.system == "chasqui" else f" ({PEER_NAMES.get(meas.system, meas.system)})"
            samples = ", ".join(fmt(x, meas.unit) for x in meas.samples)
            detail = meas.skipped or (meas.note if meas.note != previous else "as above")
            previous = meas.note
            out.append(f"- **{meas.label}**{who}: {detail}" + (f". Repeats: {samples}." if samples else ""))
    if run.failures:
        out += ["", "### Failed scenarios", ""]
        for name, detail in run.failures.items():
            first = detail.strip().splitlines()[-1] if detail.strip() else "failed"
            out.append(f"- `{name}`: {first}")
    out += ["", _METHOD, COSTS, SYNC_SPEED, CONSOLE, _SCENARIOS]
    return "\n".join(out)


def write_markdown(run, path: str) -> None:
    with open(path, "w") as f:
        f.write(markdown(run))


def summary(run) -> str:
    return f"Machine: {describe(run.machine)}\nServer:  {run.server['name']} {run.server['version']}"
