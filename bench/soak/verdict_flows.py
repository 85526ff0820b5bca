"""The soak's rules for workflows: every callback and chain step ran when it was due, and never when it was not.

A pure function of evidence, as verdict.py is (tests/bench/test_soak_verdict_flows.py plants each discrepancy):
the workflows the producer started (producer.py's ``Workflows``, one line each in ``flows.jsonl``), the ledger's
runs, the jobs left in the dead-letter queues, and what Redis says at the end: each workflow's state
(``chasqui_core.flows.read_status``) and the queue's counters of batches started and callbacks enqueued.

What a job of a workflow came to is read from the ledger and the dead-letter queue, never from Redis's batch: a
child *succeeded* when a run of it ended ``ok`` and it is not in a dead-letter queue at the end, *died* when it
is there. The verdict's other rules account for each of those jobs as for any other (verdict.py).

- **Due, so it ran.** A batch's ``on_complete`` is due once every child ended, its ``on_success`` once every
  child succeeded (a dead child replayed to success counts); a chain's step once every job of the step before it
  succeeded. A due callback or step must have ended: a run that ended ``ok``, or its dead letter (a chain's
  dying step); otherwise ``due, never ran``.
- **Not due, so it never ran**: not one start in the ledger (``ran when not due``). A chain stops at its first
  step that did not succeed.
- **Enqueued once.** The queue's ``callbacks`` counter, written by the script call that fires each callback,
  must equal the number of callbacks and steps due: more is a callback enqueued twice, fewer one lost. Its
  ``batches_started`` must equal the batches the workflows wrote (a chain's steps each).
- **Redis agrees.** Each workflow's state says what its jobs say: a batch ``succeeded`` or ``failed`` with each
  callback's fired flag set exactly when it was due; a chain ``succeeded``, or ``stopped`` at the step where the
  ledger says it stopped (``state``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .ledger import OK, Ledger

FLOWS_FILE = "flows.jsonl"
"""The producer's record of the workflows it started, one JSON line each (``Workflow.to_line``)."""


@dataclass(frozen=True, slots=True)
class Workflow:
    """A workflow as the producer started it: its jobs' ids, step by step."""

    id: str
    shape: str
    """``batch`` or ``chain``."""
    steps: tuple[tuple[str, ...], ...]
    """A batch: one step, its children. A chain: each step's jobs (the first may be a fan-in's batch)."""
    callbacks: Mapping[str, str] = field(default_factory=dict)
    """A batch's callbacks: ``success`` and ``complete`` -> job id."""

    def to_line(self) -> str:
        return json.dumps({"id": self.id, "shape": self.shape, "steps": [list(s) for s in self.steps],
                           "callbacks": dict(self.callbacks)})

    @classmethod
    def from_line(cls, text: str) -> Workflow:
        rec = json.loads(text)
        return cls(rec["id"], rec["shape"], tuple(tuple(s) for s in rec["steps"]), rec.get("callbacks", {}))

    @property
    def batches(self) -> int:
        return len(self.steps)


@dataclass(frozen=True, slots=True)
class FlowState:
    """A workflow as Redis holds it at the end."""

    status: str
    stopped_at: int | None = None
    fired: Mapping[str, bool] = field(default_factory=dict)


@dataclass(slots=True)
class FlowEvidence:
    workflows: list[Workflow]
    states: Mapping[str, FlowState | None]
    """Workflow id -> its state at the end (None: Redis had no such workflow)."""
    callbacks_counted: int
    """The workflows' queue's ``callbacks`` counter at the end."""
    batches_counted: int
    """Its ``batches_started`` counter."""

    def to_json(self) -> dict:
        """What Redis said, for evidence.json (the workflows themselves stay in ``flows.jsonl``)."""
        return {"states": {k: None if s is None else {"status": s.status, "stopped_at": s.stopped_at,
                                                      "fired": dict(s.fired)} for k, s in self.states.items()},
                "callbacks": self.callbacks_counted, "batches": self.batches_counted}

    @classmethod
    def from_json(cls, data: dict, workflows: list[Workflow]) -> FlowEvidence:
        states = {k: None if s is None else FlowState(s["status"], s["stopped_at"], s["fired"])
                  for k, s in data["states"].items()}
        return cls(workflows, states, data["callbacks"], data["batches"])


@dataclass(frozen=True, slots=True)
class Finding:
    what: str
    job_id: str
    kind: str
    detail: str


def read_workflows(lines: Iterable[str]) -> list[Workflow]:
    return [Workflow.from_line(text) for text in lines if text.strip()]


def load(directory: str, saved: dict | None) -> FlowEvidence | None:
    """The evidence of a run kept in ``directory`` (``--judge``): its workflows file and what evidence.json saved."""
    path = os.path.join(directory, FLOWS_FILE)
    if saved is None or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return FlowEvidence.from_json(saved, read_workflows(f))


def _kind(job_id: str) -> str:
    return job_id.split("-")[1] if job_id.startswith("soak-") else "?"


def _ended(job_id: str, ledger: Ledger, dead: set[str]) -> str | None:
    """``succeeded``, ``dead``, or None (neither: verdict.py reports such a job as unaccounted)."""
    if job_id in dead:
        return "dead"
    if any(r.outcome == OK for r in ledger.runs.get(job_id, ())):
        return "succeeded"
    return None


@dataclass(slots=True)
class _Expected:
    due: dict[str, bool]
    """Callback or later step's job id -> whether it was due."""
    state: FlowState


def expected(wf: Workflow, ledger: Ledger, dead: set[str]) -> _Expected | None:
    """What the ledger says the workflow came to; None when one of its due jobs has no end to judge by."""
    due: dict[str, bool] = {}
    if wf.shape == "batch":
        ends = [_ended(j, ledger, dead) for j in wf.steps[0]]
        if None in ends:
            return None
        ok = all(e == "succeeded" for e in ends)
        wanted = {"success": ok, "complete": True}
        due = {job: wanted[which] for which, job in wf.callbacks.items()}
        return _Expected(due, FlowState("succeeded" if ok else "failed", None, wanted))
    stopped = None
    for k, step in enumerate(wf.steps):
        if k:
            due.update({j: stopped is None for j in step})
            if stopped is not None:
                continue
        ends = [_ended(j, ledger, dead) for j in step]
        if k == 0 and None in ends:  # the producer's own jobs: verdict.py accounts for them
            return None
        if not all(e == "succeeded" for e in ends):  # a due step without an end is found below, and stops it
            stopped = k + 1
    return _Expected(due, FlowState("stopped" if stopped else "succeeded", stopped))


def judge_flows(ev: FlowEvidence, ledger: Ledger, dead: set[str]) -> tuple[list[Finding], list[str]]:
    """The findings about single jobs, and the problems of the workflows as a whole."""
    found: list[Finding] = []
    problems: list[str] = []
    due_total = 0
    for wf in ev.workflows:
        exp = expected(wf, ledger, dead)
        if exp is None:
            continue
        for job_id, is_due in exp.due.items():
            runs = ledger.runs.get(job_id, [])
            if is_due:
                due_total += 1
                if _ended(job_id, ledger, dead) is None:
                    found.append(Finding("due, never ran", job_id, _kind(job_id),
                                         f"due in {wf.shape} {wf.id}, but no run of it ended ok and it is not "
                                         f"dead-lettered ({len(runs)} run(s))"))
            elif runs:
                found.append(Finding("ran when not due", job_id, _kind(job_id),
                                     f"{len(runs)} run(s), but {wf.shape} {wf.id} never made it due"))
        state = ev.states.get(wf.id)
        if state is None:
            problems.append(f"{wf.shape} {wf.id}: Redis has no such workflow at the end")
            continue
        want = exp.state
        wrong = state.status != want.status or (wf.shape == "chain" and state.stopped_at != want.stopped_at)
        if wf.shape == "batch":
            wrong = wrong or any(state.fired.get(w, False) != want.fired.get(w, False) for w in wf.callbacks)
        if wrong:
            job = wf.steps[0][0] if wf.steps and wf.steps[0] else wf.id
            found.append(Finding("state", job, _kind(job),
                                 f"{wf.shape} {wf.id}: Redis says {state.status} (stopped at {state.stopped_at}, "
                                 f"fired {dict(state.fired)}), its jobs say {want.status} (stopped at "
                                 f"{want.stopped_at}, due {dict(want.fired)})"))
    if ev.workflows and ev.callbacks_counted != due_total:
        problems.append(f"workflows: {due_total} callbacks and chain steps were due, the queue counted "
                        f"{ev.callbacks_counted} enqueued (a callback enqueued twice, or one lost)")
    batches = sum(wf.batches for wf in ev.workflows)
    if ev.workflows and ev.batches_counted != batches:
        problems.append(f"workflows: {batches} batches were started, the queue counted {ev.batches_counted}")
    return found, problems
