"""The scenarios, in the order a full run goes through them, with their goals.

Goals come from issue 5 (the engine) and issue 11 (the Django path); they
are tracked in docs/benchmarks.md and never asserted: a slow machine must
not fail a build. Reference numbers are the ones the reference engine
publishes (Rust engine, 8-core Apple M3, Redis 8.6 on loopback), so they are
context, not a like-for-like comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from . import (ceiling, cluster, console_bulk, console_ops, console_scale, consumer, django_path, dlq_page, flows,
               latency, memory, peers, producer, promoter)
from .results import Measurement


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    run: Callable[..., list[Measurement]]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("queue-add", "sequential single adds (sync API)", producer.queue_add),
    Scenario("queue-add-bulk", "add_bulk in chunks", producer.queue_add_bulk),
    Scenario("queue-add-delayed", "sequential single delayed adds", producer.queue_add_delayed),
    Scenario("django-enqueue", "Django @task(...).enqueue(), one call and in a loop", django_path.django_enqueue),
    Scenario("django-enqueue-many", "Django task.enqueue_many, 1,000 calls at a time", django_path.django_enqueue_many),
    Scenario("worker-generic", "one worker, concurrency 1, async noop handler",
             partial(consumer.run_setup, name="worker-generic")),
    Scenario("worker-concurrent", "one worker process, concurrency 100, async noop handler",
             partial(consumer.run_setup, name="worker-concurrent")),
    Scenario("worker-sync", "one worker process, sync (def) noop handler in threads",
             partial(consumer.run_setup, name="worker-sync")),
    Scenario("worker-retry", "every job fails once, 1 ms backoff, then succeeds",
             partial(consumer.run_setup, name="worker-retry")),
    Scenario("worker-delayed-e2e", "a preloaded delayed set, all due, promoted and consumed",
             partial(consumer.run_setup, name="worker-delayed-e2e")),
    Scenario("runworker-async", "python manage.py runworker, async noop task, concurrency 100",
             partial(django_path.runworker, name="runworker-async")),
    Scenario("runworker-sync", "python manage.py runworker, sync noop task, concurrency 10",
             partial(django_path.runworker, name="runworker-sync")),
    Scenario("runworker-sync-100", "python manage.py runworker, sync noop task, concurrency 100 (threads)",
             partial(django_path.runworker, name="runworker-sync-100")),
    Scenario("runworker-retry", "python manage.py runworker, every job fails once then succeeds",
             partial(django_path.runworker, name="runworker-retry")),
    Scenario("runworker-signed", "python manage.py runworker, async noop task, concurrency 100, signed jobs",
             partial(django_path.runworker, name="runworker-signed")),
    Scenario("runworker-processes-2", "python manage.py runworker --processes 2, async noop task, concurrency 100 each",
             partial(django_path.runworker, name="runworker-processes-2")),
    Scenario("flows", "one worker process: a batch of 10,000 noop children + on_success, and a fan-in chain, "
             "against 10,000 plain noop jobs, in turns; the workflow checks a plain job runs", flows.run),
    Scenario("cluster-drain", "one worker process, 3 queues: on one server, then on the 3 masters of a cluster",
             cluster.run),
    Scenario("promoter", "a preloaded delayed set, all due, drained into the stream by the promoter alone",
             promoter.run),
    Scenario("latency", "enqueue -> handler start, producer and worker in separate processes", latency.run),
    Scenario("memory", "peak RSS of a worker process draining a backlog", memory.run),
    Scenario("dlq-page", "the console's DLQ page: DeadLetters.page(limit=50) on a large DLQ", dlq_page.run),
    Scenario("console-scale", "a DLQ built by a worker (--console-size N, default 1,000,000): grouped view, "
             "rare filters, filtered counts, find a job by id", console_scale.run),
    Scenario("peers", "RQ and arq on the same server: worker-concurrent and queue-add-bulk", peers.run),
)

BY_NAME = {s.name: s for s in SCENARIOS}


@dataclass(frozen=True, slots=True)
class Limit:
    """Another row of the same run that a goal's scenario cannot outrun, whatever its code does.

    A goal set as a rate on a faster day of a shared host can be out of reach
    on a slower one; the report says so, with the bound measured in the same
    run, rather than leave a reader to guess whether the code or the host fell short.
    """

    label: str
    """The bounding row."""
    share: float
    """The most the scenario can reach, as a share of that row."""
    why: str
    """Why it cannot do better, in a phrase."""


@dataclass(frozen=True, slots=True)
class Goal:
    target: str = ""
    reference: str = ""
    at_least: float = 0.0
    """The rate ``target`` asks for, in jobs/s, when it asks for one."""
    limit: Limit | None = None


TWINS: dict[str, str] = {
    cluster.LABEL_CLUSTER: cluster.LABEL_SINGLE,
    "queue-add": producer.ROUND_TRIP,
    "django-enqueue (loop)": django_path.QUEUE_ADD_BESIDE,
    "django-enqueue-many": django_path.QUEUE_ADD_BULK_BESIDE,
    "worker-retry": consumer.beside("worker-retry"),
    "worker-delayed-e2e": consumer.beside("worker-delayed-e2e"),
    flows.BATCH: flows.PLAIN,
    flows.FAN_IN: flows.PLAIN,
    **{name: setup.compared_with or django_path.beside(name) for name, setup in django_path.SETUPS.items()},
}
"""Each Django-path row and the row it is measured against (the report shows the fraction): its engine twin, or
for ``runworker-signed`` and ``runworker-processes-2`` the plain single-process ``runworker-async``; the cluster
drain against the same drain on one server; worker-retry and worker-delayed-e2e against worker-concurrent
drained in turns with each; queue-add against a bare round trip to the server measured in turns with it."""


def _on_its_twin(label: str) -> Limit:
    """A Django-path row's bound: its engine twin (``TWINS``), drained in turns with it."""
    return Limit(TWINS[label], 1.0, "the Django path is the engine's with Django's work added")


def _console_goals(size: int) -> dict[str, Goal]:
    """Issue 29's goals for the console at ``size`` dead jobs, on every console-scale row they apply to."""
    cs = console_scale
    goals = {cs.label(size, cs.GOAL_GROUPS): Goal("< 300 ms, counts that add up"),
             cs.label(size, cs.MEMORY): Goal("≤ 700 bytes")}
    for case in ("task", "error class", "group", "reason", "task and reason"):
        goals[cs.label(size, f"{cs.GOAL_RARE} ({case})")] = Goal("< 300 ms, complete page")
    for case in ("error class, 1 in 3", "task and reason"):
        goals[cs.label(size, f"{cs.GOAL_COUNT} ({case})")] = Goal("< 1 s")
    for state in ("dead", "delayed", "waiting", "finished"):
        goals[cs.label(size, f"{cs.GOAL_FIND} ({state})")] = Goal("< 100 ms")
    bulk = console_bulk
    goals[bulk.label(size, bulk.INLINE)] = Goal("< 1 s, only the matching entries read")
    goals[bulk.label(size, bulk.STOP)] = Goal("says how many of how many, truthfully")
    goals[bulk.label(size, bulk.SECOND_FIRST)] = Goal("< 1 s")
    goals[bulk.label(size, bulk.SECOND_RATE)] = Goal("≥ 10,000 entries/s")
    for case in (bulk.FIND_REPLAYED, bulk.FIND_UNKNOWN):
        goals[bulk.label(size, case)] = Goal("< 100 ms")
    goals[bulk.label(size, bulk.FIND_UNKNOWN_ALL)] = Goal("every place read, and sure")
    ops = console_ops
    goals[ops.label(ops.OPS_SIZE, ops.CONFIRM)] = Goal("< 1 s")
    goals[ops.label(ops.OPS_SIZE, ops.FIRST_PROGRESS)] = Goal("< 1 s")
    goals[ops.label(ops.OPS_SIZE, ops.REPLAY_RATE)] = Goal("≥ 10,000 entries/s")
    goals[ops.label(ops.OPS_SIZE, ops.PACED)] = Goal("the pace asked for")
    goals[ops.label(ops.OPS_SIZE, ops.SEARCH)] = Goal("≥ 200,000 entries/s")
    return goals


GOALS: dict[str, Goal] = {
    "queue-add": Goal("≥ 15,000 jobs/s (close to one round trip per call)", "16,548 jobs/s"),
    "queue-add-bulk": Goal("≥ 200,000 jobs/s", "196,038 jobs/s"),
    "worker-concurrent": Goal("≥ 100,000 jobs/s", "419,004 jobs/s (Rust handler); 46,740 jobs/s (Python handler)"),
    "worker-sync": Goal("≥ 30,000 jobs/s"),
    "worker-retry": Goal("≥ 50,000 jobs/s", "116,542 jobs/s", 50_000,
                         Limit(TWINS["worker-retry"], 0.5,
                               "every job runs twice, and a run costs at least a noop job's run")),
    "django-enqueue (loop)": Goal("≥ 80% of queue-add"),
    "django-enqueue-many": Goal("≥ 100,000 jobs/s", "", 100_000, _on_its_twin("django-enqueue-many")),
    "runworker-async": Goal("≥ 80% of worker-concurrent and ≥ 60,000 jobs/s", "", 60_000,
                            _on_its_twin("runworker-async")),
    "runworker-sync": Goal("≥ 30,000 jobs/s", "", 30_000, _on_its_twin("runworker-sync")),
    "runworker-retry": Goal("≥ 20,000 jobs/s", "", 20_000, _on_its_twin("runworker-retry")),
    "runworker-sync-100": Goal("≥ 60% of worker-concurrent"),
    "runworker-signed": Goal("≥ 95% of runworker-async"),
    "runworker-processes-2": Goal("≥ 1.6 × runworker-async, given two free cores"),
    "promoter": Goal("≥ 500,000 jobs/s", "", 500_000,
                     Limit(ceiling.LABEL, 1.0, "each promoted job is an XADD, and the ceiling is the rate of bare "
                                               "pipelined XADDs")),
    "worker-delayed-e2e": Goal("≥ 90% of worker-concurrent", "755,034 jobs/s"),
    latency.label("p50", latency.LOW_RATE): Goal("≤ 0.5 ms"),
    latency.label("p99", latency.LOW_RATE): Goal("≤ 1 ms", "1.7 ms (idle)"),
    memory.LABEL: Goal("≤ 100 MB"),
    flows.BATCH: Goal("≥ 0.8 of the plain drain beside it"),
    flows.FAN_IN: Goal("≥ 0.8 of the plain drain beside it"),
    flows.CHECKS: Goal("≤ 2% of a plain job's worker CPU (the share is in the note)"),
    dlq_page.label(200_000): Goal("< 300 ms"),
    dlq_page.label(1_000_000): Goal("< 300 ms"),
    **_console_goals(1_000_000),
}


def goal(label: str) -> Goal:
    return GOALS.get(label, Goal())


def twin(label: str) -> str | None:
    return TWINS.get(label)
