"""The soak's verdict as it prints it: the table of kinds, and the first findings of each sort with their
ledger lines, so a discrepancy can be read against the runs that raised it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .verdict import Row, Verdict

def table(verdict: Verdict, order: Iterable[str]) -> str:
    """The kind x {enqueued, succeeded, dead by reason, max runs, lost runs, discrepancies} table, as text."""
    head = ("kind", "enqueued", "replays", "succeeded", "dead (by reason)", "max runs", "lost runs", "unsettled",
            "discrepancies")
    body = []
    total = Row("total")
    for name in order:
        row = verdict.rows.get(name)
        if row is None:
            continue
        body.append(_cells(row))
        total.enqueued += row.enqueued
        total.replays += row.replays
        total.succeeded += row.succeeded
        total.dead.update(row.dead)
        total.max_runs = max(total.max_runs, row.max_runs)
        total.lost_runs += row.lost_runs
        total.unsettled += row.unsettled
        total.discrepancies += row.discrepancies
    body.append(_cells(total))
    widths = [max(len(str(r[i])) for r in (head, *body)) for i in range(len(head))]

    def fmt(cells) -> str:
        return "  ".join(str(c).ljust(w) if i in (0, 4) else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(head), rule, *map(fmt, body[:-1]), rule, fmt(body[-1])])


def _cells(row: Row) -> tuple:
    dead = ", ".join(f"{reason} {n}" for reason, n in sorted(row.dead.items())) or "-"
    return (row.kind, row.enqueued, row.replays, row.succeeded, dead, row.max_runs, row.lost_runs, row.unsettled,
            row.discrepancies)


def report_notes(verdict: Verdict, per_kind: int = 3) -> str:
    """The first few findings of each kind the evidence explains (``NOTED``), with their ledger lines."""
    out: list[str] = []
    shown: Counter = Counter()
    for d in verdict.notes:
        shown[d.what] += 1
        if shown[d.what] <= per_kind:
            out.append(f"NOTE ({d.what}): job {d.job_id} ({d.kind}): {d.detail}")
            out += [f"    {line}" for line in d.lines] or ["    (no ledger line)"]
    for what, n in sorted(shown.items()):
        if n > per_kind:
            out.append(f"... and {n - per_kind} more {what}")
    return "\n".join(out)


def report_discrepancies(verdict: Verdict, per_kind: int = 3) -> str:
    """The problems, then the first few offending jobs of each kind of discrepancy with their ledger lines."""
    out = [f"PROBLEM: {p}" for p in verdict.problems]
    shown: Counter = Counter()
    counts = verdict.counts()
    for d in verdict.discrepancies:
        if shown[d.what] >= per_kind:
            continue
        shown[d.what] += 1
        out.append(f"{d.what.upper()}: job {d.job_id} ({d.kind}): {d.detail}")
        out += [f"    {line}" for line in d.lines] or ["    (no ledger line)"]
    for what, n in sorted(counts.items()):
        if n > shown[what]:
            out.append(f"... and {n - shown[what]} more {what}")
    return "\n".join(out)
