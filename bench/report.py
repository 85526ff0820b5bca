"""Showing a run: progress lines, the results table, JSON, and docs/benchmarks.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, UTC

from . import report_text
from .machine import describe
from .page_sections import CONSOLE, COSTS, SYNC_SPEED, WORKFLOWS
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
    out += ["", report_text.METHOD, COSTS, SYNC_SPEED, CONSOLE, WORKFLOWS, report_text.SCENARIOS]
    return "\n".join(out)


def write_markdown(run, path: str) -> None:
    with open(path, "w") as f:
        f.write(markdown(run))


def summary(run) -> str:
    return f"Machine: {describe(run.machine)}\nServer:  {run.server['name']} {run.server['version']}"
