"""The soak's plan: its fault timeline and its choice of kinds (bench/soak/faults.py, kinds.py). No server needed."""

from __future__ import annotations

import random

from bench.soak.faults import FAULTS, timeline
from bench.soak.kinds import KINDS, kind_of_job, without


def test_a_two_minute_timeline_injects_every_fault_and_stops_before_the_end():
    plan = timeline(120, random.Random(7))
    assert {fault for _, fault in plan} == set(FAULTS), "every fault at least once in the CI run"
    assert all(10 <= at <= 100 for at, _ in plan), "none in the first seconds nor in the last sixth"
    assert [at for at, _ in plan] == sorted(at for at, _ in plan)


def test_the_timeline_is_fixed_by_the_seed_so_a_failing_run_can_be_repeated():
    assert timeline(600, random.Random(3)) == timeline(600, random.Random(3))
    assert timeline(600, random.Random(3)) != timeline(600, random.Random(4))


def test_each_round_goes_through_every_fault_once():
    plan = [fault for _, fault in timeline(600, random.Random(1))]
    for start in range(0, len(plan) - len(FAULTS) + 1, len(FAULTS)):
        assert sorted(plan[start:start + len(FAULTS)]) == sorted(FAULTS)


def test_without_hang_leaves_out_both_hanging_kinds_and_nothing_else():
    left = {k.name for k in without({"hang"})}
    assert left == {k.name for k in KINDS} - {"hang_sync", "hang_async"}
    assert {k.name for k in without({"crash"})} == {k.name for k in KINDS} - {"crash"}


def test_a_fire_of_a_schedule_is_a_scheduled_job_and_anything_else_unknown_has_no_kind():
    assert kind_of_job("schedule:soak-tick:1795000000000", {}) == "scheduled"
    assert kind_of_job("soak-ok-1", {"soak-ok-1": "ok"}) == "ok"
    assert kind_of_job("soak-ok-2", {}) is None
