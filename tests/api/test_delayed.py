"""The delayed set: page, one job, cancel, run now."""

import pytest

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.models import AuditEntry

from .helpers import add_delayed, stream_jobs

pytestmark = pytest.mark.django_db

Q = "default"


def test_page_soonest_first_with_cursor(view_api, redis):
    ids = [add_delayed(redis, Q, delay_ms=60_000 * (5 - i)) for i in range(5)]  # last added runs first
    first = view_api.get(f"/api/queues/{Q}/delayed", limit=2).json()
    assert [j["job_id"] for j in first["items"]] == ids[::-1][:2]
    rest = view_api.get(f"/api/queues/{Q}/delayed", limit=10, cursor=first["next_cursor"]).json()
    assert [j["job_id"] for j in rest["items"]] == ids[::-1][2:]
    assert rest["next_cursor"] is None
    item = first["items"][0]
    assert item["task"] == "tests.django.sample_tasks.add" and item["attempt"] == 0
    assert item["run_at"] is not None


def test_one_delayed_job(view_api, redis):
    job_id = add_delayed(redis, Q, kwargs={"note": "hi"})
    r = view_api.get(f"/api/queues/{Q}/delayed/{job_id}")
    assert r.status_code == 200
    assert r.json()["kwargs"] == {"note": "hi"}
    assert view_api.get(f"/api/queues/{Q}/delayed/nope").status_code == 404


def test_bad_paging_is_422(view_api):
    for params in ({"limit": 501}, {"limit": -1}, {"cursor": "garbage"}, {"cursor": "nan:0"}, {"cursor": "1_0:0"}):
        r = view_api.get(f"/api/queues/{Q}/delayed", **params)
        assert r.status_code == 422, (params, r.content)
        assert r.json()["detail"]


def test_cancel(op_api, operator, redis):
    keep = add_delayed(redis, Q)
    gone = add_delayed(redis, Q)
    r = op_api.post(f"/api/queues/{Q}/delayed/{gone}/cancel")
    assert r.status_code == 200, r.content
    assert r.json() == {"job_id": gone, "cancelled": True}
    remaining = op_api.get(f"/api/queues/{Q}/delayed").json()["items"]
    assert [j["job_id"] for j in remaining] == [keep]
    assert op_api.post(f"/api/queues/{Q}/delayed/{gone}/cancel").status_code == 404
    entry = AuditEntry.objects.get(action="cancel_delayed")
    assert (entry.target_ids, entry.count, entry.actor_id) == ([gone], 1, operator.pk)


def test_run_now(op_api, redis):
    job_id = add_delayed(redis, Q)
    r = op_api.post(f"/api/queues/{Q}/delayed/{job_id}/run-now")
    assert r.status_code == 200, r.content
    assert r.json()["entry_id"]
    assert [j.id for j in stream_jobs(redis, Q)] == [job_id]
    assert redis.zcard(QueueKeys.for_queue(Q).delayed) == 0
    assert op_api.post(f"/api/queues/{Q}/delayed/{job_id}/run-now").status_code == 404
    assert AuditEntry.objects.get(action="run_delayed_now").count == 1


def test_viewer_cannot_cancel_or_run(view_api, redis):
    job_id = add_delayed(redis, Q)
    assert view_api.post(f"/api/queues/{Q}/delayed/{job_id}/cancel").status_code == 403
    assert view_api.post(f"/api/queues/{Q}/delayed/{job_id}/run-now").status_code == 403
    assert redis.zcard(QueueKeys.for_queue(Q).delayed) == 1
