"""Workers from their heartbeats."""

import pytest

from chasqui_core.engine.ops import control
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.models import AuditEntry
from tests.helpers import TASK

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


def test_quiet_and_stop_leave_the_command_and_are_audited(op_api, operator, redis):
    heartbeat(redis, ["default"], "box-1:4242:aa")
    r = op_api.post("/api/workers/box-1:4242:aa/quiet")
    assert r.status_code == 200, r.content
    assert r.json() == {"worker": "box-1:4242:aa", "command": "quiet", "changed": True}
    assert redis.get(control.control_key("box-1:4242:aa")) == b"quiet"
    assert op_api.post("/api/workers/box-1:4242:aa/quiet").json()["changed"] is False
    assert op_api.post("/api/workers/box-1:4242:aa/stop").json() == {
        "worker": "box-1:4242:aa", "command": "stop", "changed": True}
    assert redis.get(control.control_key("box-1:4242:aa")) == b"stop"
    assert op_api.post("/api/workers/box-1:4242:aa/quiet").json()["changed"] is False, "a stop is not undone"
    entries = list(AuditEntry.objects.order_by("id"))
    assert [(e.action, e.count, e.target_ids, e.source, e.actor_id) for e in entries] == [
        ("worker_quiet", 1, ["box-1:4242:aa"], "api", operator.pk),
        ("worker_quiet", 0, ["box-1:4242:aa"], "api", operator.pk),
        ("worker_stop", 1, ["box-1:4242:aa"], "api", operator.pk),
        ("worker_quiet", 0, ["box-1:4242:aa"], "api", operator.pk),
    ]


def test_commands_need_the_permission_and_a_live_worker(op_api, view_api, redis):
    heartbeat(redis, ["default"], "w-live")
    heartbeat(redis, ["default"], "w-gone", age_ms=120_000)
    assert view_api.post("/api/workers/w-live/stop").status_code == 403
    assert redis.get(control.control_key("w-live")) is None
    r = op_api.post("/api/workers/nobody/quiet")
    assert r.status_code == 404 and "No worker 'nobody'" in r.json()["detail"]
    assert op_api.post("/api/workers/w-gone/stop").status_code == 404
    assert not AuditEntry.objects.exists()


def test_a_workers_running_jobs_paged_from_its_start_journal(view_api, redis):
    heartbeat(redis, ["default", "emails"], "w-run")
    q, e = Queue("default", redis_client=redis), Queue("emails", redis_client=redis)
    jobs = [q.add(TASK, [i, 0]) for i in range(3)] + [e.add(TASK, [9, 9])]
    for n, job in enumerate(jobs):
        queue = "emails" if n == 3 else "default"
        redis.hset(QueueKeys.for_queue(queue).running("w-run"), job.entry_id, 1_760_000_000_000 + n)
    first = view_api.get("/api/workers/w-run/running", limit=3).json()
    assert first["total"] == 4 and first["offset"] == 0
    assert [(i["queue"], i["job_id"], i["task"]) for i in first["items"]] == [
        ("default", jobs[0].job_id, TASK), ("default", jobs[1].job_id, TASK), ("default", jobs[2].job_id, TASK)]
    rest = view_api.get("/api/workers/w-run/running", offset=3, limit=3).json()["items"]
    assert [(i["queue"], i["job_id"]) for i in rest] == [("emails", jobs[3].job_id)]
    assert view_api.get("/api/workers/w-run").json()["state"] == "running"
    assert view_api.get("/api/workers/ghost/running").status_code == 404


def test_a_workers_running_jobs_include_those_of_every_priority_band(view_api, redis):
    heartbeat(redis, ["default"], "w-band")
    q = Queue("default", redis_client=redis)
    keys = QueueKeys.for_queue("default")
    jobs = {p: q.add(TASK, [p, 0], priority=p) for p in (60, 0, -60)}
    for n, (p, band) in enumerate(((60, "high"), (0, ""), (-60, "low"))):
        redis.hset(keys.in_band(band).running("w-band"), jobs[p].entry_id, 1_760_000_000_000 + n)
    body = view_api.get("/api/workers/w-band/running").json()
    assert body["total"] == 3
    assert [(i["job_id"], i["priority"], i["entry_id"]) for i in body["items"]] == [
        (jobs[p].job_id, p, jobs[p].entry_id) for p in (60, 0, -60)]
