"""Workers from their heartbeats."""

import pytest

from .helpers import heartbeat

pytestmark = pytest.mark.django_db


def test_workers_live_and_stale(view_api, redis):
    started = 1_760_000_000_000
    heartbeat(redis, ["default", "emails"], "w-live", in_flight=3, processed=120, rss_kb=51_200, supervisor=4200,
              current=[("emails.tasks.send", "01JOB", started)])
    heartbeat(redis, ["emails"], "w-gone", age_ms=120_000)
    r = view_api.get("/api/workers")
    assert r.status_code == 200
    by_id = {w["id"]: w for w in r.json()["items"]}
    assert set(by_id) == {"w-live", "w-gone"}
    live = by_id["w-live"]
    assert (live["host"], live["pid"], live["queues"], live["concurrency"], live["in_flight"], live["processed"]) == (
        "box-1", 4242, ["default", "emails"], 8, 3, 120)
    assert live["stale"] is False and by_id["w-gone"]["stale"] is True
    assert live["supervisor_pid"] == 4200 and by_id["w-gone"]["supervisor_pid"] is None
    assert live["last_seen"] is not None
    assert live["memory_kb"] == 51_200 and by_id["w-gone"]["memory_kb"] == 0
    assert live["current"] == [{"task": "emails.tasks.send", "job_id": "01JOB",
                                "started_at": "2025-10-09T08:53:20Z"}]
    only_default = view_api.get("/api/workers", queue="default").json()["items"]
    assert [w["id"] for w in only_default] == ["w-live"]
    lenient = view_api.get("/api/workers", stale_after_ms=600_000).json()["items"]
    assert all(not w["stale"] for w in lenient)


def test_workers_bad_input(view_api):
    assert view_api.get("/api/workers", queue="ghost").status_code == 404
    r = view_api.get("/api/workers", stale_after_ms=0)
    assert r.status_code == 422
    assert "stale_after_ms" in r.json()["detail"]


def test_queue_stats_count_live_workers(view_api, redis):
    heartbeat(redis, ["default"], "w1", in_flight=2)
    heartbeat(redis, ["default"], "w2", age_ms=3_600_000, in_flight=5)
    stats = view_api.get("/api/queues/default").json()
    assert (stats["workers"], stats["in_flight"]) == (1, 2)
