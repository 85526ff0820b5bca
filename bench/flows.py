"""What workflows cost: a batch's drain and a fan-in's against the same jobs enqueued plainly, and what a job outside
any workflow pays.

One worker process (concurrency 100, async noop handler, as ``worker-concurrent``) drains, in turns within each
round, three backlogs of n jobs: n plain jobs; a batch of n children with an ``on_success`` callback; a fan-in
chain (the same batch, then a step fed the list of its n results). The window opens when the first handler starts
and closes when the last job (for a workflow: its callback or last step, which only the last child's settle call
can enqueue) is acknowledged, so a workflow's rate is n children over a window that includes the callback's run.
Each backlog is loaded before the worker reads it (``flow_start.lua``: one call per workflow).

The cost to a job outside any workflow is the code it runs because workflows exist: one dict lookup when it is
settled (``meta.get("flow")``, settle/outcomes.py) and one membership test when it starts (``"fed" in meta``,
worker/delivery.py); its settle call carries no workflow section. Those two checks are timed in turns with the
same loop without them, over the metas of real envelopes, and reported as a share of the worker's CPU per job in
the plain drain of the same run.
"""

from __future__ import annotations

from collections.abc import Callable

from chasqui_core.engine.flows import batches
from chasqui_core.engine.flows.compose import BatchSpec, start_batch, start_chain
from chasqui_core.engine.flows.refs import FED, FLOW
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.producer.queue import JobSpec, Queue

from . import consumer
from .handlers import NOOP
from .results import RATE, BenchError, Measurement
from .stats import median
from .turns import in_blocks

PLAIN = "flows: plain drain (beside the workflows)"
BATCH = "flows: batch + on_success"
FAN_IN = "flows: fan-in chain"
CHECKS = "flows: cost to a job outside any workflow"

SETUP = consumer.SETUPS["worker-concurrent"]

Preload = Callable[[Queue, int], str | None]
"""Load a backlog of n children; the workflow's id (None for plain jobs)."""


def _plain(q: Queue, n: int) -> None:
    q.add_bulk(JobSpec(NOOP, [i]) for i in range(n))
    return None


def _batch(q: Queue, n: int) -> str:
    return start_batch(q, BatchSpec([JobSpec(NOOP, [i]) for i in range(n)], on_success=JobSpec(NOOP, [-1]))).id


def _fan_in(q: Queue, n: int) -> str:
    return start_chain(q, [BatchSpec([JobSpec(NOOP, [i]) for i in range(n)]), JobSpec(NOOP, [])]).id


KINDS: list[tuple[str, Preload, int]] = [(PLAIN, _plain, 0), (BATCH, _batch, 1), (FAN_IN, _fan_in, 1)]
"""Each backlog: its row, its loader, and the jobs its workflow adds when it is due (the callback, the last step)."""


def _drain(ctx, child, label: str, preload: Preload, size: int, extra: int) -> dict:
    ctx.flush()
    flow = preload(Queue(ctx.queue, redis_client=ctx.client), size)
    reply = child.request({"n": size + extra}, timeout=max(120.0, size / 100))
    consumer.check_settled(ctx.client, ctx.queue, size + extra)
    if flow is not None:
        last = batches.read(ctx.client, flow if label == BATCH else f"{flow}-2")
        if last.status != "succeeded" or not all(c.fired for c in last.callbacks.values()):
            raise BenchError(f"{label}: the workflow did not end as it should ({last.status}, {last.callbacks})")
    return reply


def _checks(ctx, n: int) -> tuple[float, float]:
    """µs per job of the two workflow checks a plain job meets, and of the same loop without them (medians)."""
    q = Queue(ctx.queue, redis_client=ctx.client)
    metas = [decode(q.build(JobSpec(NOOP, [i], meta={"backend": "default"})).payload).meta for i in range(n)]
    sink: list[object] = []

    def with_checks(start: int, stop: int) -> None:
        for meta in metas[start:stop]:
            sink.append(meta.get(FLOW))
            sink.append(FED in meta)

    def without(start: int, stop: int) -> None:
        for meta in metas[start:stop]:
            sink.append(meta)
            sink.append(meta)

    runs = [in_blocks(n, 1_000, with_checks, without) for _ in range(max(3, ctx.repeats))]
    sink.clear()
    return (median([a.wall / a.jobs * 1e6 for a, _ in runs]), median([b.wall / b.jobs * 1e6 for _, b in runs]))


def run(ctx) -> list[Measurement]:
    n = ctx.size(10_000, 500)
    sizes = [ctx.warmup_size(n)] + [n] * ctx.repeats
    replies: dict[str, list[dict]] = {label: [] for label, _, _ in KINDS}
    with consumer.worker_process(ctx, SETUP) as child:
        for i, size in enumerate(sizes):
            for label, preload, extra in KINDS if i % 2 == 0 else KINDS[::-1]:
                reply = _drain(ctx, child, label, preload, size, extra)
                if i:  # the first round is the warm-up
                    replies[label].append(reply)
    ctx.flush()
    notes = {PLAIN: f"{n:,} noop jobs enqueued plainly, concurrency 100, in turns with the two workflows",
             BATCH: f"a batch of {n:,} noop children and an on_success callback; children per second, the "
                    "callback's run inside the window",
             FAN_IN: f"a chain: a batch of {n:,} noop children, then a step fed the list of their results"}
    rows = []
    for label, _, _ in KINDS:
        got = replies[label]
        cpu = median([r["cpu_seconds"] / r["jobs"] * 1e6 for r in got])
        note = f"{notes[label]}; the worker process used {cpu:.1f} µs of CPU per job (median)"
        if label != PLAIN:  # the backlogs of a round were drained back to back: their ratio is the steadiest figure
            pairs = [p["seconds"] / r["seconds"] for r, p in zip(got, replies[PLAIN], strict=True)]
            note += (f"; against the plain drain of the same round: "
                     f"{', '.join(f'{x:.2f}' for x in pairs)} (median {median(pairs):.2f})")
        rows.append(Measurement("flows", label, RATE, [n / r["seconds"] for r in got], jobs=n, cpu_us_per_job=cpu,
                                note=note))
    checked, bare = _checks(ctx, 100_000)
    extra_us = max(0.0, checked - bare)
    plain_cpu = rows[0].cpu_us_per_job or 0.0
    share = 100 * extra_us / plain_cpu if plain_cpu else 0.0
    rows.append(Measurement("flows", CHECKS, "µs", [extra_us], jobs=100_000, lower_is_better=True,
                            note=f"meta.get('flow') and 'fed' in meta: {checked:.3f} µs a job against {bare:.3f} µs "
                                 f"for the loop without them, timed in turns; {share:.2f}% of the {plain_cpu:.1f} µs "
                                 "of worker CPU a plain job took beside the workflows"))
    return rows
