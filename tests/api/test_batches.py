"""GET /api/batches/{id}: a workflow's status, counts, callbacks and children, for those allowed to see it."""

import pytest

from chasqui_core.engine.worker.worker import Worker
from chasqui_core.flows import batch, chain, step
from chasqui_core.task_runner import build_registry
from tests.django import flow_tasks
from tests.helpers import run_until

pytestmark = pytest.mark.django_db


def _drain(redis_url, until):
    worker = Worker(["default"], build_registry(), url=redis_url, install_signal_handlers=False,
                    promoter_poll_interval=0.02, block_ms=50)
    run_until(worker, until, 30)


def test_a_batch_as_the_api_shows_it(view_api, redis, redis_url):
    flow_tasks.RUNS.clear()
    handle = batch([step(flow_tasks.square, i) for i in range(3)],
                   on_success=step(flow_tasks.notify, "<b>done</b>")).enqueue()
    r = view_api.get(f"/api/batches/{handle.id}")
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["kind"], body["status"], body["total"], body["pending"]) == ("batch", "running", 3, 3)
    assert [c["state"] for c in body["children"]] == ["pending"] * 3
    assert body["callbacks"][0]["name"] == "success" and body["callbacks"][0]["fired"] is False
    _drain(redis_url, lambda: any(r[0] == "notify" for r in flow_tasks.RUNS))
    body = view_api.get(f"/api/batches/{handle.id}").json()
    assert (body["status"], body["succeeded"], body["pending"]) == ("succeeded", 3, 0)
    assert [c["result"] for c in body["children"]] == [0, 1, 4]
    assert [c["job_id"] for c in body["children"]] == handle.job_ids
    assert body["callbacks"][0]["fired"] is True


def test_a_chain_as_the_api_shows_it(view_api, redis):
    handle = chain(step(flow_tasks.fetch, "x"), step(flow_tasks.parse)).enqueue()
    body = view_api.get(f"/api/batches/{handle.id}").json()
    assert (body["kind"], body["status"], body["steps"], body["total"]) == ("chain", "running", 2, 2)
    assert len(body["children"]) == 2


def test_batches_need_the_permission_and_a_known_id(view_api, outsider_api, anon_api, redis):
    handle = batch([step(flow_tasks.square, 1)]).enqueue()
    assert outsider_api.get(f"/api/batches/{handle.id}").status_code == 403
    assert anon_api.get(f"/api/batches/{handle.id}").status_code == 401
    r = view_api.get("/api/batches/default:01NOTHERE")
    assert r.status_code == 404 and "never existed" in r.json()["detail"]
    r = view_api.get("/api/batches/no-queue-here")
    assert r.status_code == 422 and "not a batch id" in r.json()["detail"]


def test_cancelling_a_batch_cancels_its_waiting_children(op_api, view_api, redis, redis_url):
    from chasqui_core.models import AuditEntry

    flow_tasks.RUNS.clear()
    handle = batch([step(flow_tasks.square, i) for i in range(3)], on_success=step(flow_tasks.notify, "ok"),
                   on_complete=step(flow_tasks.notify, "ended")).enqueue()
    assert view_api.post(f"/api/batches/{handle.id}/cancel").status_code == 403
    r = op_api.post(f"/api/batches/{handle.id}/cancel")
    assert r.status_code == 200, r.content
    assert r.json() == {"batch_id": handle.id, "cancelled": 3}
    _drain(redis_url, lambda: any(r[0] == "notify" for r in flow_tasks.RUNS))
    assert flow_tasks.RUNS == [("notify", "ended")], "no child ran; on_complete fired, on_success did not"
    body = view_api.get(f"/api/batches/{handle.id}").json()
    assert (body["status"], body["dead"]) == ("failed", 3)
    entry = AuditEntry.objects.get(action="cancel_job")
    assert entry.count == 3 and entry.detail["batch"] == handle.id


def test_replaying_a_batchs_dead_children_fires_on_success_once(op_api, view_api, redis, redis_url):
    from chasqui_core.models import AuditEntry

    flow_tasks.RUNS.clear()
    flow_tasks.FIXED.clear()
    handle = batch([step(flow_tasks.square, 3), step(flow_tasks.fragile, "a"), step(flow_tasks.fragile, "b")],
                   on_success=step(flow_tasks.notify, "ok"), on_complete=step(flow_tasks.notify, "ended")).enqueue()
    _drain(redis_url, lambda: ("notify", "ended") in flow_tasks.RUNS)
    assert view_api.post(f"/api/batches/{handle.id}/replay-dead").status_code == 403
    assert redis.xlen("{chasqui:default}:dlq") == 2, "a viewer's refused replay touched nothing"
    flow_tasks.FIXED.update({"a", "b"})
    r = op_api.post(f"/api/batches/{handle.id}/replay-dead")
    assert r.status_code == 200, r.content
    assert r.json() == {"batch_id": handle.id, "dead": 2, "replayed": 2}
    assert redis.xlen("{chasqui:default}:dlq") == 0
    _drain(redis_url, lambda: ("notify", "ok") in flow_tasks.RUNS)
    body = view_api.get(f"/api/batches/{handle.id}").json()
    assert (body["status"], body["succeeded"], body["dead"]) == ("succeeded", 3, 0)
    assert [c["result"] for c in body["children"]] == [9, "a", "b"]
    assert [r for r in flow_tasks.RUNS if r[0] == "notify"] == [("notify", "ended"), ("notify", "ok")]
    assert op_api.post(f"/api/batches/{handle.id}/replay-dead").json() == {"batch_id": handle.id, "dead": 0,
                                                                          "replayed": 0}
    entry = AuditEntry.objects.get(action="replay")
    assert entry.count == 2 and entry.source == "api"
