"""Queues: stats, one queue, pause/resume, metrics."""

import pytest

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.models import AuditEntry

from tests.helpers import TASK, add_dead

from .helpers import add_delayed

pytestmark = pytest.mark.django_db


def test_list_shows_configured_and_registered_queues_with_live_stats(op_api, redis):
    q = Queue("default", redis_client=redis)
    for i in range(3):
        q.add(TASK, [i, 1])
    add_delayed(redis, "default")
    add_dead(redis, "default")
    add_dead(redis, "other")
    r = op_api.get("/api/queues")
    assert r.status_code == 200, r.content
    by_name = {item["name"]: item for item in r.json()["items"]}
    assert set(by_name) == {"default", "emails", "other"}
    assert by_name["default"]["stream_length"] == 3
    assert by_name["default"]["delayed"] == 1
    assert by_name["default"]["dlq"] == 1
    assert by_name["other"]["dlq"] == 1
    assert by_name["emails"]["stream_length"] == 0
    assert by_name["default"]["paused"] is False


def test_one_queue(view_api, redis):
    Queue("emails", redis_client=redis).add(TASK, [1, 2])
    r = view_api.get("/api/queues/emails")
    assert r.status_code == 200
    assert r.json()["name"] == "emails"
    assert r.json()["stream_length"] == 1


def test_unknown_queue_is_404(view_api):
    r = view_api.get("/api/queues/nope")
    assert r.status_code == 404
    assert "nope" in r.json()["detail"]
    assert view_api.get("/api/queues/not%20valid").status_code == 404


def test_pause_and_resume_are_audited(op_api, operator, redis):
    r = op_api.post("/api/queues/emails/pause")
    assert r.status_code == 200, r.content
    assert r.json() == {"queue": "emails", "paused": True, "changed": True}
    assert redis.exists(QueueKeys.for_queue("emails").paused)
    assert op_api.get("/api/queues/emails").json()["paused"] is True
    again = op_api.post("/api/queues/emails/pause")
    assert again.json()["changed"] is False
    r = op_api.post("/api/queues/emails/resume")
    assert r.json() == {"queue": "emails", "paused": False, "changed": True}
    assert not redis.exists(QueueKeys.for_queue("emails").paused)
    entries = list(AuditEntry.objects.order_by("id"))
    assert [(e.action, e.queue, e.count, e.source, e.actor_id) for e in entries] == [
        ("pause", "emails", 1, "api", operator.pk),
        ("pause", "emails", 0, "api", operator.pk),
        ("resume", "emails", 1, "api", operator.pk),
    ]
    key_prefix = entries[0].detail["key_prefix"]
    assert op_api.key.startswith(key_prefix)
    audit = op_api.get("/api/audit").json()["items"]
    assert audit[-1]["detail"]["key_prefix"] == key_prefix  # shown: a prefix is not a secret


def test_viewer_cannot_pause(view_api, redis):
    r = view_api.post("/api/queues/emails/pause")
    assert r.status_code == 403
    assert "pause_queues" in r.json()["detail"]
    assert not redis.exists(QueueKeys.for_queue("emails").paused)
    assert not AuditEntry.objects.exists()


def test_pause_unknown_queue_is_404(op_api):
    assert op_api.post("/api/queues/ghost/pause").status_code == 404


def test_metrics_per_second_and_per_minute(view_api, redis):
    q = Queue("default", redis_client=redis)
    for i in range(4):
        q.add(TASK, [i, 0])
    r = view_api.get("/api/queues/default/metrics")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["resolution"] == "second" and body["step_ms"] == 1000
    assert len(body["points"]["enqueued"]) == 3600
    assert sum(body["points"]["enqueued"]) == 4
    assert set(body["fields"]) >= {"enqueued", "completed", "failed", "retried", "dlq"}
    r = view_api.get("/api/queues/default/metrics", resolution="minute", window=10)
    assert r.status_code == 200
    assert len(r.json()["points"]["enqueued"]) == 10
    assert sum(r.json()["points"]["enqueued"]) == 4


def test_metrics_bad_input_is_422(view_api):
    r = view_api.get("/api/queues/default/metrics", resolution="hour")
    assert r.status_code == 422
    assert "resolution" in r.json()["detail"]
    r = view_api.get("/api/queues/default/metrics", resolution="minute", window=2000)
    assert r.status_code == 422
    assert "window" in r.json()["detail"]


def test_purge_deletes_waiting_jobs_only_and_is_audited(op_api, view_api, operator, redis):
    q = Queue("default", redis_client=redis)
    for i in range(12):
        q.add(TASK, [i, 0])
    keys = QueueKeys.for_queue("default")
    redis.xgroup_create(keys.stream, "chasqui", id="0", mkstream=True)
    redis.xreadgroup("chasqui", "w-1", {keys.stream: ">"}, count=2)
    assert view_api.post("/api/queues/default/purge").status_code == 403
    r = op_api.post("/api/queues/default/purge")
    assert r.status_code == 200, r.content
    assert r.json() == {"queue": "default", "purged": 10}
    assert redis.xlen(keys.stream) == 2, "the two jobs a worker holds stay"
    [entry] = AuditEntry.objects.all()
    assert (entry.action, entry.queue, entry.count, entry.actor_id) == ("purge", "default", 10, operator.pk)
    assert op_api.post("/api/queues/ghost/purge").status_code == 404


def test_history_gives_failures_and_run_time_per_task(view_api, redis):
    from chasqui_core.engine.ops import totals

    Queue("default", redis_client=redis).add(TASK, [1, 2])
    keys = QueueKeys.for_queue("default")
    flat = totals.duration_increments(["t.a", "t.a"], [40, 4000], ["t.a"])
    for field, amount in zip(flat[::2], flat[1::2], strict=True):
        redis.hincrby(keys.durations, field, amount)
    r = view_api.get("/api/queues/default/history", range="24h")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["range"] == "24h" and body["step_seconds"] == 900 and len(body["failures"]) == 96
    assert body["since"] is None
    assert body["tasks"] == [{"task": "t.a", "runs": 2, "failures": 1, "mean_ms": 2020.0, "p50_ms": 50,
                              "p95_ms": 5000}]
    assert view_api.get("/api/queues/default/history", range="2w").status_code == 422
    assert view_api.get("/api/queues/ghost/history").status_code == 404


def test_a_queue_with_priority_bands_sums_them_and_counts_each_bands_waiting_jobs(view_api, redis):
    q = Queue("emails", redis_client=redis)
    for priority in (10, 10, 0, -5):
        q.add(TASK, [1, 2], priority=priority)
    body = view_api.get("/api/queues/emails").json()
    assert body["stream_length"] == 4
    assert body["bands"] == {"high": 2, "default": 1, "low": 1}
    assert view_api.get("/api/queues/default").json()["bands"] == {}, "a queue without priorities has none"


def test_purge_empties_every_priority_band(op_api, redis):
    q = Queue("default", redis_client=redis)
    for priority in (3, 0, 0, -3):
        q.add(TASK, [1, 2], priority=priority)
    r = op_api.post("/api/queues/default/purge")
    assert r.json() == {"queue": "default", "purged": 4}
    keys = QueueKeys.for_queue("default")
    assert [redis.xlen(keys.in_band(b).stream) for b in ("high", "", "low")] == [0, 0, 0]


def test_totals_give_every_counter_and_the_dead_letters_per_reason(view_api, redis):
    q = Queue("default", redis_client=redis)
    for i in range(3):
        q.add(TASK, [i, 0])
    # what reclaim.lua and settle.lua leave after a worker died under a run
    redis.hset(QueueKeys.for_queue("default").totals, mapping={"lost": 1, "recovered": 4, "fetched": 9, "dlq": 2,
                                                                "dlq:panic": 1, "dlq:retries_exhausted": 1})
    r = view_api.get("/api/queues/default/totals")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["queue"] == "default"
    assert body["counters"]["enqueued"] == 3, "counted by the enqueue itself"
    assert {k: body["counters"][k] for k in ("fetched", "lost", "recovered", "dlq", "completed")} == {
        "fetched": 9, "lost": 1, "recovered": 4, "dlq": 2, "completed": 0}
    assert body["dead_lettered"] == {"panic": 1, "retries_exhausted": 1}
    assert view_api.get("/api/queues/nope/totals").status_code == 404
