"""The audit log: every change recorded with the right count, listed with filters."""

import pytest
from django.contrib import admin
from django.test import Client

from chasqui_core.models import AuditEntry

from tests.helpers import bulk_dead

from .helpers import add_delayed

pytestmark = pytest.mark.django_db

Q = "default"


def test_each_change_is_recorded_with_its_count(op_api, operator, redis):
    ids = bulk_dead(redis, Q, 6, task="t.a")
    bulk_dead(redis, Q, 4, task="t.b")
    delayed = [add_delayed(redis, Q) for _ in range(2)]
    op_api.post(f"/api/queues/{Q}/pause")
    op_api.post(f"/api/queues/{Q}/resume")
    op_api.post(f"/api/queues/{Q}/dlq/replay", {"ids": ids[:2]})
    op_api.post(f"/api/queues/{Q}/dlq/discard", {"filter": {"task": "t.b"}})
    op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"task": "t.a"}})
    op_api.post(f"/api/queues/{Q}/delayed/{delayed[0]}/cancel")
    op_api.post(f"/api/queues/{Q}/delayed/{delayed[1]}/run-now")
    op_api.post(f"/api/queues/{Q}/jobs", {"task": "tests.django.sample_tasks.add", "args": [1, 2]})
    op_api.post(f"/api/queues/{Q}/dlq/replay", {"ids": ["1-1"]})  # nothing there: recorded with 0
    got = [(e.action, e.count, e.filter) for e in AuditEntry.objects.order_by("id")]
    assert got == [
        ("pause", 1, {}),
        ("resume", 1, {}),
        ("replay", 2, {}),
        ("discard", 4, {"task": "t.b"}),
        ("replay", 4, {"task": "t.a"}),
        ("cancel_delayed", 1, {}),
        ("run_delayed_now", 1, {}),
        ("enqueue", 1, {}),
        ("replay", 0, {}),
    ]
    assert all(e.actor_id == operator.pk and e.source == "api" for e in AuditEntry.objects.all())
    assert AuditEntry.objects.filter(action="replay").order_by("id").first().target_ids == ids[:2]


def test_reads_and_refused_changes_are_not_recorded(op_api, view_api, redis):
    view_api.post(f"/api/queues/{Q}/pause")
    op_api.post(f"/api/queues/{Q}/dlq/replay", {})
    op_api.get("/api/queues")
    assert not AuditEntry.objects.exists()


def test_listing_with_filters_and_cursor(op_api, view_api, redis):
    for _ in range(3):
        op_api.post(f"/api/queues/{Q}/pause")
    op_api.post("/api/queues/emails/resume")
    r = view_api.get("/api/audit")
    assert r.status_code == 200
    items = r.json()["items"]
    assert [i["action"] for i in items] == ["resume", "pause", "pause", "pause"]
    assert items[0]["actor"].startswith("olga (API key ")
    assert [i["queue"] for i in view_api.get("/api/audit", queue="emails").json()["items"]] == ["emails"]
    assert len(view_api.get("/api/audit", action="pause").json()["items"]) == 3
    assert view_api.get("/api/audit", actor="olga").json()["items"]
    assert view_api.get("/api/audit", actor="someone").json()["items"] == []
    assert view_api.get("/api/audit", source="cli").json()["items"] == []
    assert view_api.get("/api/audit", until="2000-01-01T00:00:00Z").json()["items"] == []
    page1 = view_api.get("/api/audit", limit=3).json()
    page2 = view_api.get("/api/audit", limit=3, cursor=page1["next_cursor"]).json()
    assert len(page1["items"]) == 3 and len(page2["items"]) == 1 and page2["next_cursor"] is None
    assert {i["id"] for i in page1["items"]}.isdisjoint({i["id"] for i in page2["items"]})


def test_listing_bad_input_is_422(view_api):
    for params in ({"action": "explode"}, {"source": "fax"}, {"cursor": "abc"}, {"limit": 100_000},
                   {"since": "whenever"}):
        r = view_api.get("/api/audit", **params)
        assert r.status_code == 422, params
        assert r.json()["detail"]


def test_admin_shows_the_log_read_only(operator, redis):
    from django.contrib.auth.models import User

    admin_user = User.objects.create_superuser("root", password="pw")
    AuditEntry.objects.create(actor=operator, actor_repr="olga", action="pause", queue=Q, source="cli", count=1)
    client = Client()
    client.force_login(admin_user)
    r = client.get("/admin/chasqui_core/auditentry/")
    assert r.status_code == 200
    assert b"olga" in r.content
    model_admin = admin.site._registry[AuditEntry]
    assert not model_admin.has_change_permission(None) and not model_admin.has_delete_permission(None)
    keys = client.get("/admin/chasqui_core/apikey/")
    assert keys.status_code == 200
