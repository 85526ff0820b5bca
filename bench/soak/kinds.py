"""The kinds of job the soak runs, and what each must come to.

A kind is a task (bench/soak/tasks.py) on a queue, with a budget of runs
(``@task(max_attempts=...)``) and an expected end: succeeded, or
dead-lettered with one reason. The verdict judges each job against its
kind, so a kind says everything needed to account for its jobs. Nothing here
imports Django: the verdict and its tests read it without a project.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUES = ("soak-a", "soak-b", "soak-c")
"""Several queues served by one ``runworker``: kinds are spread over them."""

HANG_TIMEOUT = 2
"""Seconds a hanging job may run (``@task(timeout=...)``) before it is charged a JobTimeout."""
SLEEP_FOREVER = 3600
"""What a hanging job sleeps: far beyond any run of the soak."""


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    task: str
    """Function name in bench/soak/tasks.py."""
    queue: str
    budget: int
    """Runs the job gets (``max_attempts``), its first included."""
    expect: str
    """``succeeded`` or ``dead``."""
    reason: str = ""
    """The DLQ reason a dead job of this kind must have."""
    error_class_suffix: str = ""
    """What the class of the last error of a dead job must end with ('' for any)."""
    weight: int = 0
    """Share of the producer's steady stream of jobs (0: enqueued on a timer of its own, or not by the producer)."""
    every: float = 0.0
    """Seconds between two jobs of a kind that is enqueued on a timer (rare kinds: crash, sync hang)."""
    hang: bool = False
    """A run that never ends by itself: a start without an end is its normal way to fail."""
    delayed: bool = False
    """Enqueued with ``run_after`` a few seconds ahead."""
    async_: bool = False
    concurrency: int = 0
    """At most this many of its runs at once, held by a concurrency limit (settings.py); 0: no limit."""
    rate: int = 0
    """At most this many of its runs start in any second, held by a rate limit (settings.py); 0: no limit."""
    kills: bool = False
    """Its run ends its process at once (``os._exit``): the run's start is when that process died."""
    flow: bool = False
    """A job of a workflow (producer.py's ``Workflows``): a child or first step the producer enqueued with its
    workflow, or a callback or later chain step that Redis enqueued when it was due. Its id names its kind
    (``soak-<kind>-<n>``), and verdict_flows.py judges when it had to run."""


KINDS: tuple[Kind, ...] = (
    Kind("ok", "ok", "soak-a", 3, "succeeded", weight=40),
    Kind("delayed", "ok_delayed", "soak-a", 3, "succeeded", weight=8, delayed=True),
    Kind("slow_sync", "slow_sync", "soak-b", 3, "succeeded", weight=6),
    Kind("slow_async", "slow_async", "soak-c", 3, "succeeded", weight=6, async_=True),
    Kind("fail_once", "fail_once", "soak-a", 3, "succeeded", weight=10, async_=True),
    Kind("always_fail", "always_fail", "soak-b", 3, "dead", "retries_exhausted", weight=6),
    Kind("unrecoverable", "unrecoverable", "soak-c", 3, "dead", "unrecoverable", weight=4, async_=True),
    Kind("fixed_by_replay", "fixed_by_replay", "soak-b", 2, "succeeded", weight=3),
    Kind("crash", "crash", "soak-c", 3, "dead", "panic", every=40.0, kills=True),
    Kind("hang_sync", "hang_sync", "soak-b", 2, "dead", "retries_exhausted", "JobTimeout", every=30.0, hang=True),
    Kind("hang_async", "hang_async", "soak-c", 2, "dead", "retries_exhausted", "JobTimeout", weight=1, hang=True,
         async_=True),
    Kind("scheduled", "scheduled", "soak-a", 2, "succeeded"),
    Kind("limited", "limited", "soak-a", 3, "succeeded", weight=6, async_=True, concurrency=2, rate=30),
    Kind("flow_ok", "flow_ok", "soak-b", 3, "succeeded", flow=True),
    Kind("flow_fail", "flow_fail", "soak-b", 2, "dead", "retries_exhausted", flow=True),
    Kind("flow_fixed", "flow_fixed", "soak-b", 2, "succeeded", flow=True),
    Kind("flow_crash", "flow_crash", "soak-b", 3, "succeeded", kills=True, flow=True),
    Kind("flow_callback", "flow_callback", "soak-b", 3, "succeeded", flow=True),
)
"""``fixed_by_replay`` fails until the soak marks it fixed and replays it from the DLQ (with one more attempt),
then succeeds: its dead-letter entries are consumed by the replays (``flow_fixed``, a workflow's child or chain
step, the same way: its replay's success fires its batch's ``on_success`` or carries its chain on). ``flow_crash``
ends its process on its first run only, then succeeds. ``flow_callback`` jobs are workflows' callbacks and later
chain steps: one fed a value checks it against the one it expects. ``scheduled`` jobs come from the schedules.
``limited`` jobs run under a concurrency and a rate limit (settings.py): the verdict checks both from the
ledger's run times; waiting on either must cost them no attempt (the budget check)."""

BY_NAME = {k.name: k for k in KINDS}
BY_TASK = {k.task: k for k in KINDS}

SCHEDULES = {"soak-tick": ("scheduled", 5), "soak-tock": ("scheduled", 7)}
"""Schedule name -> (kind, seconds between fires). Their jobs' ids are ``schedule:<name>:<due ms>``."""
SCHEDULE_PREFIX = "schedule:"
FLOW_QUEUE = "soak-b"
"""The queue of every workflow (a workflow runs on one queue)."""


def kind_of_job(job_id: str, enqueued: dict[str, str]) -> str | None:
    """The kind of a job: from the producer's record, or ``scheduled`` for a fire of a schedule."""
    kind = enqueued.get(job_id)
    if kind is None and job_id.startswith(SCHEDULE_PREFIX):
        return "scheduled"
    if kind is None and job_id.startswith("soak-flow_"):  # a callback or a later step: Redis enqueued it
        named = BY_NAME.get(job_id.split("-")[1])
        return named.name if named is not None and named.flow else None
    return kind


def without(names: set[str]) -> tuple[Kind, ...]:
    """The kinds left once ``--without`` takes some out (``hang`` names both hanging kinds, ``flows`` every
    workflow kind)."""
    out = set()
    for name in names:
        out |= {k.name for k in KINDS if k.name == name or (name == "hang" and k.hang) or (name == "flows" and k.flow)}
    return tuple(k for k in KINDS if k.name not in out)
