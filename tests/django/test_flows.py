"""The workflow examples of chasqui_core.flows, as a project writes them, run by a real worker."""

from __future__ import annotations

import pytest

from chasqui_core.flows import UnknownBatch, WorkflowError, batch, chain, get_batch, step
from chasqui_core.task_runner import build_registry
from chasqui_core.engine.worker.worker import Worker
from tests.helpers import run_until

from . import flow_tasks
from .flow_tasks import broken, elsewhere, fetch, lister, notify, parse, square, store, total


@pytest.fixture(autouse=True)
def _clean(fresh_backend):
    flow_tasks.RUNS.clear()


def _run(redis_url, until, timeout=30.0):
    worker = Worker(["default"], build_registry(), url=redis_url, install_signal_handlers=False,
                    promoter_poll_interval=0.02, block_ms=50)
    run_until(worker, until, timeout)


def _ran(name):
    return [r for r in flow_tasks.RUNS if r[0] == name]


def test_a_batch_with_both_callbacks(redis, redis_url):
    handle = batch([step(square, i) for i in range(5)], on_success=step(notify, "ok"),
                   on_complete=step(notify, "complete")).enqueue()
    _run(redis_url, lambda: len(_ran("notify")) == 2)
    assert sorted(_ran("notify")) == [("notify", "complete"), ("notify", "ok")]
    status = get_batch(handle.id)
    assert (status.kind, status.status, status.total, status.succeeded, status.pending) == ("batch", "succeeded",
                                                                                          5, 5, 0)
    assert status.results == [0, 1, 4, 9, 16]
    assert status.children == handle.job_ids


def test_a_chain_passes_each_result_on(redis, redis_url):
    handle = chain(step(fetch, "x"), step(parse), step(store, table="t")).enqueue()
    _run(redis_url, lambda: _ran("store"))
    assert flow_tasks.RUNS == [("fetch", "x"), ("parse", "<p>x</p>"), ("store", ["x"], "t")]
    status = get_batch(handle.id)
    assert (status.kind, status.status, status.steps, status.stopped_at) == ("chain", "succeeded", 3, None)
    assert status.results == ["<p>x</p>", ["x"], "1 row(s) in t"]


def test_a_fan_in_gets_the_batch_results_in_order(redis, redis_url):
    handle = chain(batch([step(square, i) for i in range(10)]), step(total)).enqueue()
    _run(redis_url, lambda: _ran("total"))
    assert _ran("total") == [("total", [i * i for i in range(10)])]
    assert get_batch(handle.id).results[-1] == sum(i * i for i in range(10))


def test_a_dead_step_stops_its_chain_and_its_replay_carries_it_on(redis, redis_url):
    from chasqui_core.engine.dlq.replay import DeadLetters

    handle = chain(step(fetch, "x"), step(broken), step(notify)).enqueue()
    _run(redis_url, lambda: redis.xlen("{chasqui:default}:dlq") == 1)
    status = get_batch(handle.id)
    assert (status.status, status.stopped_at, status.states) == ("stopped", 2, ["succeeded", "dead", "pending"])
    assert _ran("notify") == []
    # the step is fixed (here: its dead envelope's task is pointed at one that works) and replayed
    [(entry_id, _)] = redis.xrange("{chasqui:default}:dlq")
    assert DeadLetters(redis, "default").replay([entry_id]) == 1
    flow_tasks.RUNS.clear()
    _run(redis_url, lambda: _ran("notify") or len(_ran("broken")) == 1 and redis.xlen("{chasqui:default}:dlq"))
    assert _ran("broken") == [("broken", "<p>x</p>")], "the replayed step ran, fed as before"
    assert get_batch(handle.id).stopped_at == 2, "it failed again: the chain stays stopped there"


def test_a_child_adds_children_to_its_running_batch(redis, redis_url):
    handle = batch([step(lister, 4)], on_success=step(notify, "all rows")).enqueue()
    _run(redis_url, lambda: _ran("notify"))
    assert len(_ran("square")) == 4, "on_success waited for the children added while the batch ran"
    status = get_batch(handle.id)
    assert (status.total, status.succeeded, status.results) == (5, 5, [4, 0, 1, 4, 9])


def test_bad_workflows_are_refused_in_words(redis):
    with pytest.raises(WorkflowError, match="runs on one queue"):
        batch([step(square, 1)], on_success=step(elsewhere)).enqueue()
    with pytest.raises(WorkflowError, match="takes a task"):
        step(print, 1)
    with pytest.raises(TypeError, match="JSON-serializable"):
        batch([step(square, object())]).enqueue()
    with pytest.raises(UnknownBatch):
        get_batch("default:01NOPE")
    assert redis.xlen("{chasqui:default}:stream") == 0
