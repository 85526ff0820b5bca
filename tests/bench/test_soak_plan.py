"""The soak's plan: its fault timeline, its choice of kinds, its seed and its busy processes. No server needed."""

from __future__ import annotations

import itertools
import random

from bench.soak.contention import Contention
from bench.soak.faults import FAULTS, NETWORK_FAULTS, PAST_VISIBILITY, plan, timeline
from bench.soak.run import announce, parse
from bench.soak.workers import alive
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


def test_with_network_faults_a_two_minute_plan_still_injects_every_fault_one_network_fault_at_a_time():
    every = 12.0
    full = plan(120, random.Random(7), every=every, network=True)
    assert {fault for _, fault in full} == set(FAULTS) | set(NETWORK_FAULTS)
    assert [at for at, _ in full] == sorted(at for at, _ in full)
    network = [at for at, fault in full if fault in NETWORK_FAULTS]
    longest = 5.0 + PAST_VISIBILITY  # the soak's default visibility timeout, and past it
    assert all(b - a >= longest for a, b in itertools.pairwise(network)), "each heals before the next begins"
    assert plan(120, random.Random(7), every=every) == timeline(120, random.Random(7), every=every)


def test_the_seed_is_drawn_per_run_whatever_the_global_generator_and_printed_first():
    drawn = []
    for _ in range(3):
        random.seed(1)
        args = parse([])
        assert args.drawn
        drawn.append(args.seed)
    assert len(set(drawn)) > 1, "a new seed for each run, not one the global generator's state fixes"
    assert announce(args) == f"soak: seed {args.seed} (drawn for this run; run it again with --seed {args.seed})"
    given = parse(["--seed", "42", "--contention", "2", "--network-faults"])
    assert (given.seed, given.drawn, given.contention, given.network_faults) == (42, False, 2, True)
    assert announce(given).startswith("soak: seed 42 (given;")


def test_busy_processes_run_until_stopped_and_stop_by_themselves_at_their_lifetime():
    with Contention(2, lifetime=120) as busy:
        pids = [p.pid for p in busy.procs]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids) and busy.procs == []
    short = Contention(1, lifetime=0.2)
    (pid,) = short.start()
    proc = short.procs[0]
    assert proc.wait(timeout=30) == 0, "it stopped by itself"
    short.stop()
    assert not alive(pid)
