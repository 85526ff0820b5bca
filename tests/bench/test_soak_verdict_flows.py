"""The soak's workflow rules (bench/soak/verdict_flows.py), each shown failing on evidence planted to break it.

The clean evidence: a batch whose dead child was replayed to success (both callbacks due), a batch with a
child that stayed dead (only on_complete due), a chain that ran to its end, and a chain stopped at its dead
second step. Each test changes one thing and expects the one finding that change must raise.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

from bench.soak import kinds
from bench.soak.ledger import parse
from bench.soak.verdict_flows import FlowEvidence, FlowState, Workflow, judge_flows, read_workflows

_runs = itertools.count(1)

B1 = Workflow("soak-b:01B1", "batch", (("soak-flow_ok-1", "soak-flow_fixed-2"),),
              {"success": "soak-flow_callback-3", "complete": "soak-flow_callback-4"})
B2 = Workflow("soak-b:01B2", "batch", (("soak-flow_ok-5", "soak-flow_fail-6"),),
              {"success": "soak-flow_callback-7", "complete": "soak-flow_callback-8"})
C1 = Workflow("soak-b:01C1", "chain", (("soak-flow_ok-9",), ("soak-flow_callback-10",), ("soak-flow_callback-11",)))
C2 = Workflow("soak-b:01C2", "chain", (("soak-flow_ok-12",), ("soak-flow_fail-13",), ("soak-flow_callback-14",)))
DEAD = {"soak-flow_fail-6", "soak-flow_fail-13"}


def _run(job_id: str, outcome: str | None = "ok", attempt: int = 1, at: float = 10.0) -> list[dict]:
    run = f"r{next(_runs)}"
    lines = [{"j": job_id, "k": kinds.kind_of_job(job_id, {}), "e": "start", "r": run, "a": attempt, "p": 1,
              "t": at}]
    if outcome is not None:
        lines.append({"j": job_id, "e": "end", "r": run, "o": outcome, "t": at + 0.1})
    return lines


def _clean_lines() -> list[dict]:
    lines = []
    for job in ("soak-flow_ok-1", "soak-flow_ok-5", "soak-flow_ok-9", "soak-flow_ok-12"):
        lines += [{"j": job, "k": "flow_ok", "e": "enqueue", "t": 1.0}, *_run(job)]
    lines += [{"j": "soak-flow_fixed-2", "k": "flow_fixed", "e": "enqueue", "t": 1.0},
              *_run("soak-flow_fixed-2", "error"), *_run("soak-flow_fixed-2", "error", 2, 11.0),
              {"j": "soak-flow_fixed-2", "k": "flow_fixed", "e": "replay", "reset": False, "t": 12.0},
              *_run("soak-flow_fixed-2", "ok", 3, 13.0)]
    lines += [{"j": "soak-flow_fail-6", "k": "flow_fail", "e": "enqueue", "t": 1.0},
              *_run("soak-flow_fail-6", "error"), *_run("soak-flow_fail-6", "error", 2, 11.0)]
    lines += _run("soak-flow_fail-13", "error") + _run("soak-flow_fail-13", "error", 2, 11.0)
    for job in ("soak-flow_callback-3", "soak-flow_callback-4", "soak-flow_callback-8", "soak-flow_callback-10",
                "soak-flow_callback-11"):
        lines += _run(job, at=20.0)
    return lines


STATES = {B1.id: FlowState("succeeded", None, {"success": True, "complete": True}),
          B2.id: FlowState("failed", None, {"success": False, "complete": True}),
          C1.id: FlowState("succeeded"), C2.id: FlowState("stopped", 2)}


def _judge(lines=None, states=None, callbacks=6, batches=8, dead=DEAD):
    ledger = parse(json.dumps(line) for line in (lines if lines is not None else _clean_lines()))
    ev = FlowEvidence([B1, B2, C1, C2], states if states is not None else dict(STATES), callbacks, batches)
    return judge_flows(ev, ledger, set(dead))


def _without_runs_of(job_id: str) -> list[dict]:
    return [line for line in _clean_lines() if line.get("j") != job_id]


def test_the_clean_evidence_passes_and_the_callback_jobs_have_their_kind():
    assert _judge() == ([], [])
    assert kinds.kind_of_job("soak-flow_callback-3", {}) == "flow_callback"
    assert kinds.kind_of_job("soak-flow_nothing-3", {}) is None


def test_a_due_on_complete_that_never_ran_is_found():
    found, _ = _judge(_without_runs_of("soak-flow_callback-8"))
    assert [(f.what, f.job_id) for f in found] == [("due, never ran", "soak-flow_callback-8")]


def test_a_due_on_success_after_a_replay_that_never_ran_is_found():
    found, _ = _judge(_without_runs_of("soak-flow_callback-3"))
    assert [(f.what, f.job_id) for f in found] == [("due, never ran", "soak-flow_callback-3")]


def test_an_on_success_that_ran_though_a_child_stayed_dead_is_found():
    found, _ = _judge(_clean_lines() + _run("soak-flow_callback-7", at=30.0))
    assert [(f.what, f.job_id) for f in found] == [("ran when not due", "soak-flow_callback-7")]


def test_a_chain_that_went_on_past_its_dead_step_is_found():
    found, _ = _judge(_clean_lines() + _run("soak-flow_callback-14", "error", at=30.0))
    assert [(f.what, f.job_id) for f in found] == [("ran when not due", "soak-flow_callback-14")]


def test_a_chain_that_stopped_though_every_step_before_succeeded_is_found():
    found, _ = _judge(_without_runs_of("soak-flow_callback-11"), callbacks=6)
    assert ("due, never ran", "soak-flow_callback-11") in [(f.what, f.job_id) for f in found]


def test_a_callback_enqueued_twice_or_lost_is_a_problem():
    assert "enqueued twice" in " ".join(_judge(callbacks=7)[1])
    assert "6 callbacks and chain steps were due, the queue counted 5" in " ".join(_judge(callbacks=5)[1])


def test_batches_not_all_counted_is_a_problem():
    assert _judge(batches=7)[1] == ["workflows: 8 batches were started, the queue counted 7"]


def test_redis_disagreeing_with_the_jobs_is_found():
    wrong_status = {**STATES, B2.id: FlowState("succeeded", None, {"success": False, "complete": True})}
    assert [f.what for f in _judge(states=wrong_status)[0]] == ["state"]
    wrong_flag = {**STATES, B2.id: FlowState("failed", None, {"success": True, "complete": True})}
    assert [f.what for f in _judge(states=wrong_flag)[0]] == ["state"]
    wrong_stop = {**STATES, C2.id: replace(STATES[C2.id], stopped_at=3)}
    assert [f.what for f in _judge(states=wrong_stop)[0]] == ["state"]


def test_a_workflow_redis_does_not_have_is_a_problem():
    states = {**STATES, C1.id: None}
    assert _judge(states=states)[1] == [f"chain {C1.id}: Redis has no such workflow at the end"]


def test_a_workflow_is_read_back_as_the_producer_wrote_it():
    assert read_workflows([B1.to_line(), "", C2.to_line()]) == [B1, C2]
