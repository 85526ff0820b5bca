"""Workflows against a real server: each callback and each chain step is enqueued exactly once, by the atomic
call that settles the child making it due (docs/workflows.md names the rule each test holds)."""

from __future__ import annotations

import time

import pytest

from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.flows import batches
from chasqui_core.engine.flows.compose import BatchSpec, WorkflowError, read_chain, start_batch, start_chain
from chasqui_core.engine.jobs.events import BATCH_COMPLETED, BATCH_SUCCEEDED, read_events
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.ops.totals import read_totals
from chasqui_core.engine.producer.queue import JobSpec, Queue
from tests.engine.worker_app import wait_for
from tests.helpers import add_dead, dead_job, worker_running

LOG = "flows:runs"


def registry(client) -> HandlerRegistry:
    """Handlers that record each run (job id) on LOG; ``fail`` fails until the key ``fixed`` exists."""
    reg = HandlerRegistry()

    def echo(ctx, *args, **kwargs):
        client.rpush(LOG, ctx.job.id)
        return list(args) if len(args) != 1 else args[0]

    def square(ctx, x):
        client.rpush(LOG, ctx.job.id)
        return x * x

    def total(ctx, values, plus=0):
        client.rpush(LOG, ctx.job.id)
        client.set("flows:total", sum(values) + plus)
        return sum(values) + plus

    def fail(ctx, *_):
        client.rpush(LOG, ctx.job.id)
        if not client.exists("fixed"):
            raise ValueError("not fixed yet")
        return "fixed"

    def gate(ctx, key):
        """Wait until ``key`` exists, so several workers finish together."""
        client.rpush(LOG + ":started", ctx.job.id)
        client.sadd(LOG + ":workers", ctx.worker_id)
        deadline = time.monotonic() + 30
        while not client.exists(key) and time.monotonic() < deadline:
            time.sleep(0.002)
        client.rpush(LOG, ctx.job.id)
        return key

    for name, fn in (("echo", echo), ("square", square), ("total", total), ("fail", fail), ("gate", gate)):
        reg.register(name, fn, takes_context=True, max_attempts=1)
    return reg


def runs(client, job_id: str) -> int:
    return sum(1 for j in client.lrange(LOG, 0, -1) if j.decode() == job_id)


def quiet(client, seconds: float = 0.5) -> None:
    """Let a running worker go on a little, so a callback enqueued twice would have run twice."""
    length = client.llen(LOG)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if client.llen(LOG) != length:
            length, deadline = client.llen(LOG), time.monotonic() + seconds


def test_a_batch_fires_each_callback_once_and_keeps_results_in_order(redis, redis_url):
    q = Queue("wf-batch", redis_client=redis)
    spec = BatchSpec([JobSpec("square", [i]) for i in range(6)], on_success=JobSpec("echo", ["success"]),
                     on_complete=JobSpec("echo", ["complete"]))
    started = start_batch(q, spec)
    with worker_running(redis_url, ["wf-batch"], registry(redis)):
        state = batches.read(redis, started.id)
        success, complete = state.callbacks["success"].job_id, state.callbacks["complete"].job_id
        wait_for(lambda: runs(redis, success) and runs(redis, complete), 30, "both callbacks")
        quiet(redis)
    state = batches.read(redis, started.id)
    assert (state.status, state.total, state.succeeded, state.dead) == ("succeeded", 6, 6, 0)
    assert state.results == [i * i for i in range(6)]
    assert state.children == started.job_ids
    assert runs(redis, success) == 1 and runs(redis, complete) == 1
    assert state.callbacks["success"].fired and state.callbacks["complete"].fired


def test_a_chain_feeds_each_step_the_previous_result(redis, redis_url):
    q = Queue("wf-chain", redis_client=redis)
    started = start_chain(q, [JobSpec("square", [3]), JobSpec("echo", [1]), JobSpec("echo", ["last"])])
    with worker_running(redis_url, ["wf-chain"], registry(redis)):
        wait_for(lambda: read_chain(redis, started.id)[-1].status == "succeeded", 30, "the chain's last step")
        quiet(redis)
    steps = read_chain(redis, started.id)
    assert [s.results for s in steps] == [[9], [[9, 1]], [[[9, 1], "last"]]]
    assert all(runs(redis, s.children[0]) == 1 for s in steps)


def test_a_fan_in_gets_its_batch_results_in_order(redis, redis_url):
    q = Queue("wf-fanin", redis_client=redis)
    started = start_chain(q, [BatchSpec([JobSpec("square", [i]) for i in range(10)]),
                              JobSpec("total", kwargs={"plus": 1})])
    with worker_running(redis_url, ["wf-fanin"], registry(redis)):
        wait_for(lambda: redis.get("flows:total") is not None, 30, "the fan-in step")
        quiet(redis)
    assert int(redis.get("flows:total")) == sum(i * i for i in range(10)) + 1
    steps = read_chain(redis, started.id)
    assert steps[1].results == [sum(i * i for i in range(10)) + 1]
    assert runs(redis, steps[1].children[0]) == 1


def test_a_dead_child_fires_on_complete_and_its_replay_fires_on_success_once(redis, redis_url):
    q = Queue("wf-dead", redis_client=redis)
    spec = BatchSpec([JobSpec("square", [2]), JobSpec("fail")], on_success=JobSpec("echo", ["success"]),
                     on_complete=JobSpec("echo", ["complete"]))
    started = start_batch(q, spec)
    success = batches.read(redis, started.id).callbacks["success"].job_id
    complete = batches.read(redis, started.id).callbacks["complete"].job_id
    with worker_running(redis_url, ["wf-dead"], registry(redis)):
        wait_for(lambda: runs(redis, complete), 30, "on_complete after the death")
        quiet(redis)
        state = batches.read(redis, started.id)
        assert (state.status, state.succeeded, state.dead) == ("failed", 1, 1)
        assert state.states == ["succeeded", "dead"]
        assert runs(redis, success) == 0, "a dead child keeps on_success waiting"
        redis.set("fixed", 1)
        [entry] = redis.xrange(q.keys.dlq)
        assert DeadLetters(redis, "wf-dead").replay([entry[0]]) == 1
        wait_for(lambda: runs(redis, success), 30, "on_success after the replay")
        quiet(redis)
    state = batches.read(redis, started.id)
    assert (state.status, state.succeeded, state.dead) == ("succeeded", 2, 0)
    assert state.results == [4, "fixed"]
    assert runs(redis, success) == 1 and runs(redis, complete) == 1
    # operators see each end once: in the queue's counters and its events stream
    counters = read_totals(redis, ["wf-dead"])["wf-dead"].counters
    assert {k: counters[k] for k in ("batches_started", "batches_completed", "batches_succeeded", "callbacks")} == {
        "batches_started": 1, "batches_completed": 1, "batches_succeeded": 1, "callbacks": 2}
    ends = [(e.type, e.extra, e.job_id, e.count) for e in read_events(redis, "wf-dead")[1]
            if e.type in (BATCH_COMPLETED, BATCH_SUCCEEDED)]
    assert ends == [(BATCH_COMPLETED, {"batch": started.id}, complete, 2),
                    (BATCH_SUCCEEDED, {"batch": started.id}, success, 2)], "completed at the death, succeeded after"


def test_discarding_a_dead_child_counts_as_its_end(redis):
    """A child whose death the batch never saw (here written straight to the DLQ) ends when it is discarded,
    and that end fires on_complete in the discard's own call; a second discard changes nothing."""
    q = Queue("wf-discard", redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec("fail")], on_complete=JobSpec("echo", ["complete"])))
    [child] = started.job_ids
    redis.delete(q.keys.stream)  # the child is taken off the stream as if it had died unseen
    job = dead_job("fail")
    job.id, job.meta = child, {"flow": started.id}
    entry = add_dead(redis, "wf-discard", job)
    assert redis.xlen(q.keys.stream) == 0
    assert DeadLetters(redis, "wf-discard").discard([entry]) == 1
    state = batches.read(redis, started.id)
    assert (state.status, state.discarded, state.states) == ("failed", 1, ["discarded"])
    assert state.callbacks["complete"].fired
    assert redis.xlen(q.keys.stream) == 1, "on_complete was enqueued by the discard"
    assert DeadLetters(redis, "wf-discard").discard([entry]) == 0
    assert redis.xlen(q.keys.stream) == 1


def test_two_workers_finishing_the_last_children_together_fire_once(redis, redis_url):
    """Two workers run a batch's two children, held until both started (or a second passed: a worker may have
    fetched both), then released together; every callback runs once. The script-level test below makes the
    two settle calls meet for certain."""
    q = Queue("wf-race", redis_client=redis)
    reg = registry(redis)
    started = []
    with worker_running(redis_url, ["wf-race"], reg, concurrency=2), \
            worker_running(redis_url, ["wf-race"], reg, concurrency=2):
        for n in range(12):
            s = start_batch(q, BatchSpec([JobSpec("gate", [f"go:{n}"]) for _ in range(2)],
                                         on_success=JobSpec("echo", ["success"]),
                                         on_complete=JobSpec("echo", ["complete"])))
            started.append(s)
            deadline = time.monotonic() + 1
            while time.monotonic() < deadline and not all(redis.lpos(LOG + ":started", j) is not None
                                                          for j in s.job_ids):
                time.sleep(0.01)
            redis.set(f"go:{n}", 1)
        wait_for(lambda: all(batches.read(redis, s.id).callbacks["complete"].fired for s in started), 60,
                 "every batch complete")
        callbacks = [c.job_id for s in started for c in batches.read(redis, s.id).callbacks.values()]
        wait_for(lambda: all(runs(redis, c) for c in callbacks), 30, "every callback run")
        quiet(redis)
    assert [runs(redis, c) for c in callbacks] == [1] * len(callbacks)


def test_two_settle_calls_ending_the_last_two_children_at_once_fire_once(redis, redis_url):
    """Two consumers hold the batch's last two children and settle them in the same instant, each with its own
    connection (two workers): one call counts the last child and enqueues each callback; the other does not."""
    import threading

    from chasqui_core.engine.settle.settler import _Batch, settle_call
    from chasqui_core.engine.store.keys import GROUP
    from chasqui_core.engine.store.scripts import Scripts
    from tests.conftest import connect_tests

    q = Queue("wf-meet", redis_client=redis)
    redis.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    for round_ in range(20):
        s = start_batch(q, BatchSpec([JobSpec("echo", [k]) for k in range(2)], on_success=JobSpec("echo"),
                                     on_complete=JobSpec("echo")))
        calls = []
        for k, worker in enumerate(("w1", "w2")):
            [(_, [(entry_id, _)])] = redis.xreadgroup(GROUP, worker, {q.keys.stream: ">"}, count=1)
            b = _Batch(done=[entry_id], completed=[[s.job_ids[k], "echo", 1]],
                       flow_ends=[entry_id, s.id, s.job_ids[k], "ok", bytes([k])])
            calls.append(settle_call(q.keys, worker, b))
        clients = [connect_tests(redis_url) for _ in calls]
        barrier = threading.Barrier(len(calls))

        def settle(client, call, barrier=barrier):
            script = Scripts(client)
            barrier.wait()
            script.settle(**call)

        threads = [threading.Thread(target=settle, args=pair) for pair in zip(clients, calls, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        state = batches.read(redis, s.id)
        assert (state.status, state.results) == ("succeeded", [0, 1]), f"round {round_}"
        assert redis.xlen(q.keys.stream) == 2, f"round {round_}: each callback once"
        redis.delete(q.keys.stream)
        redis.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
        for c in clients:
            c.close()


def test_a_settle_call_repeated_after_its_reply_was_lost_counts_the_child_once(redis):
    """The call that ends the last child is re-sent (Redis restarted before its reply arrived): the child is
    counted once and the callback enqueued once."""
    from chasqui_core.engine.settle.settler import _Batch, settle_call
    from chasqui_core.engine.store.keys import GROUP
    from chasqui_core.engine.store.scripts import Scripts

    q = Queue("wf-resend", redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec("echo", [1])], on_success=JobSpec("echo", ["success"])))
    redis.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    [(_, [(entry_id, _)])] = redis.xreadgroup(GROUP, "w", {q.keys.stream: ">"})
    b = _Batch(done=[entry_id], completed=[[started.job_ids[0], "echo", 1]],
               flow_ends=[entry_id, started.id, started.job_ids[0], "ok", b"\x01"])
    call = settle_call(q.keys, "w", b)
    Scripts(redis).settle(**call)
    Scripts(redis).settle(**call)
    state = batches.read(redis, started.id)
    assert (state.succeeded, state.results) == (1, [1])
    assert redis.xlen(q.keys.stream) == 1, "the callback was enqueued once"


def test_bad_workflows_are_refused_in_words(redis):
    q = Queue("wf-bad", redis_client=redis)
    with pytest.raises(WorkflowError, match="at least two steps"):
        start_chain(q, [JobSpec("echo")])
    with pytest.raises(WorkflowError, match="only a chain's first step may be a batch"):
        start_chain(q, [JobSpec("echo"), BatchSpec([JobSpec("echo")])])
    with pytest.raises(ValueError, match="is not a batch id"):
        batches.read(redis, "no-colon")
    with pytest.raises(batches.UnknownBatch, match="never existed"):
        batches.read(redis, "wf-bad:01ABC")
    assert redis.xlen(q.keys.stream) == 0


def test_an_empty_batch_fires_its_callbacks_at_once(redis):
    q = Queue("wf-empty", redis_client=redis)
    started = start_batch(q, BatchSpec([], on_success=JobSpec("echo"), on_complete=JobSpec("echo")))
    state = batches.read(redis, started.id)
    assert state.status == "succeeded" and all(c.fired for c in state.callbacks.values())
    assert redis.xlen(q.keys.stream) == 2


@pytest.mark.timeout(150)
def test_the_worker_running_the_last_child_crashes_and_each_callback_still_runs_once(redis, workers):
    """The worker process running the batch's last child dies (os._exit) before settling it; another worker
    takes the entry back, runs it again and settles it: that call fires each callback, once."""
    from tests.engine.worker_app import read_runs, runs_by_job, settled

    log = "wf-crash:runs"
    q = Queue("wf-crash", redis_client=redis)
    s = start_batch(q, BatchSpec([JobSpec("noop", kwargs={"log": log}),
                                  JobSpec("die_on_signal", ["wf-crash:go"], {"log": log})],
                                 on_success=JobSpec("noop", kwargs={"log": log}),
                                 on_complete=JobSpec("noop", kwargs={"log": log})))
    callbacks = [c.job_id for c in batches.read(redis, s.id).callbacks.values()]
    first = workers.start("wf-crash", visibility_ms=1000)
    wait_for(lambda: set(runs_by_job(read_runs(redis, log))) >= set(s.job_ids), 60, "both children running")
    redis.set("wf-crash:go", 1)
    wait_for(lambda: first.poll() is not None, 30, "the worker's crash")
    assert not batches.read(redis, s.id).callbacks["success"].fired
    workers.bury(redis, first, "wf-crash")
    workers.start("wf-crash", visibility_ms=1000)
    wait_for(lambda: all(c in runs_by_job(read_runs(redis, log)) for c in callbacks), 90, "both callbacks")
    wait_for(lambda: settled(redis, "wf-crash"), 30, "nothing left to run (a second callback would be)")
    state = batches.read(redis, s.id)
    assert (state.status, state.succeeded) == ("succeeded", 2)
    by_job = runs_by_job(read_runs(redis, log))
    assert len(by_job[s.job_ids[1]]) == 2, "the last child ran again after the crash"
    assert [len(by_job[c]) for c in callbacks] == [1, 1]


def test_a_dead_step_stops_its_chain_and_replayed_to_success_carries_it_on(redis, redis_url):
    q = Queue("wf-chain-replay", redis_client=redis)
    started = start_chain(q, [JobSpec("square", [2]), JobSpec("fail"), JobSpec("echo", ["after"])])
    with worker_running(redis_url, ["wf-chain-replay"], registry(redis)):
        wait_for(lambda: redis.xlen(q.keys.dlq) == 1, 30, "the second step's death")
        quiet(redis)
        steps = read_chain(redis, started.id)
        assert [s.status for s in steps] == ["succeeded", "failed", "running"]
        assert not runs(redis, steps[2].children[0]), "a dead step stops its chain"
        redis.set("fixed", 1)
        [(entry_id, _)] = redis.xrange(q.keys.dlq)
        DeadLetters(redis, "wf-chain-replay").replay([entry_id])
        wait_for(lambda: read_chain(redis, started.id)[2].status == "succeeded", 30, "the chain's last step")
        quiet(redis)
    steps = read_chain(redis, started.id)
    assert steps[2].results == [["fixed", "after"]]
    assert [runs(redis, s.children[0]) for s in steps] == [1, 2, 1]
