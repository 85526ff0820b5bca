"""Authentication (API keys, sessions with CSRF) and the permission matrix over every endpoint."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.models import ApiKey

from .helpers import ApiClient, key_client

pytestmark = pytest.mark.django_db

OP = "7cbd179a-6969-4d06-8bcb-4d191581e013"  # fixed: parallel test processes must collect the same test ids

# (method, path, body) for every endpoint of the API.
READS = [
    ("get", "/api/queues", None),
    ("get", "/api/queues/default", None),
    ("get", "/api/queues/default/metrics", None),
    ("get", "/api/queues/default/totals", None),
    ("get", "/api/tasks", None),
    ("get", "/api/jobs/01ABC", None),
    ("get", "/api/queues/default/delayed", None),
    ("get", "/api/queues/default/delayed/job-1", None),
    ("get", "/api/queues/default/dlq", None),
    ("get", "/api/queues/default/dlq/groups", None),
    ("get", "/api/queues/default/dlq/1-0", None),
    ("get", "/api/workers", None),
    ("get", "/api/operations", None),
    ("get", f"/api/operations/{OP}", None),
    ("get", "/api/audit", None),
]
CHANGES = [
    ("post", "/api/queues/default/pause", None, "pause_queues"),
    ("post", "/api/queues/default/resume", None, "pause_queues"),
    ("post", "/api/queues/default/jobs", {"task": "tests.django.sample_tasks.add", "args": [1, 2]}, "enqueue_jobs"),
    ("post", "/api/queues/default/delayed/job-1/cancel", None, "discard_jobs"),
    ("post", "/api/queues/default/delayed/job-1/run-now", None, "enqueue_jobs"),
    ("post", "/api/queues/default/dlq/replay", {"filter": {}}, "replay_jobs"),
    ("post", "/api/queues/default/dlq/discard", {"filter": {}}, "discard_jobs"),
    ("post", "/api/queues/default/dlq/1-0/replay", None, "replay_jobs"),
    ("post", "/api/queues/default/dlq/1-0/discard", None, "discard_jobs"),
]
QUEUE_ENDPOINTS = [(m, p, b) for m, p, b in READS if "/queues/default" in p] + [
    (m, p, b) for m, p, b, _ in CHANGES
]


def call(api, method, path, body=None):
    return api.get(path) if method == "get" else api.post(path, body)


@pytest.mark.parametrize("method,path,body", READS + [c[:3] for c in CHANGES])
def test_anonymous_gets_401_and_nothing_else(anon_api, method, path, body):
    r = call(anon_api, method, path, body)
    assert r.status_code == 401
    assert set(r.json()) == {"detail"}
    assert "Authorization: Bearer" in r.json()["detail"]
    assert r["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("method,path,body", READS)
def test_user_without_view_permission_gets_403_on_reads(outsider_api, method, path, body):
    r = call(outsider_api, method, path, body)
    assert r.status_code == 403
    assert "view_queues" in r.json()["detail"]


@pytest.mark.parametrize("method,path,body,perm", CHANGES)
def test_viewer_gets_403_on_every_change(view_api, method, path, body, perm):
    r = call(view_api, method, path, body)
    assert r.status_code == 403
    assert f"chasqui_core.{perm}" in r.json()["detail"]


MISSING_ITEMS = {"/api/jobs/01ABC", "/api/queues/default/delayed/job-1", "/api/queues/default/dlq/1-0",
                 f"/api/operations/{OP}"}


@pytest.mark.parametrize("method,path,body", READS)
def test_viewer_can_read(view_api, method, path, body):
    r = call(view_api, method, path, body)
    if path in MISSING_ITEMS:  # allowed in, and told the item does not exist
        assert r.status_code == 404, r.content
        assert r.json()["detail"]
    else:
        assert r.status_code == 200, r.content


@pytest.mark.parametrize("method,path,body", QUEUE_ENDPOINTS)
def test_unknown_queue_is_404_everywhere(op_api, method, path, body):
    r = call(op_api, method, path.replace("/queues/default", "/queues/nowhere"), body)
    assert r.status_code == 404, r.content
    assert "nowhere" in r.json()["detail"]


def test_revoked_and_wrong_keys_are_refused(operator):
    row, key = ApiKey.issue(operator)
    assert ApiClient(key).get("/api/queues").status_code == 200
    assert ApiClient(key + "x").get("/api/queues").status_code == 401
    assert ApiClient("not-a-key").get("/api/queues").status_code == 401
    row.revoked_at = timezone.now()
    row.save()
    assert ApiClient(key).get("/api/queues").status_code == 401


def test_key_of_inactive_user_is_refused(operator):
    api = key_client(operator)
    operator.is_active = False
    operator.save()
    assert api.get("/api/queues").status_code == 401


def test_only_the_hash_is_stored_and_last_used_is_throttled(operator):
    row, key = ApiKey.issue(operator)
    assert key not in {row.key_hash, row.prefix, row.name}
    assert row.prefix == key[:8]
    api = ApiClient(key)
    api.get("/api/queues")
    row.refresh_from_db()
    first = row.last_used_at
    assert first is not None
    api.get("/api/queues")
    row.refresh_from_db()
    assert row.last_used_at == first  # not rewritten within a minute
    ApiKey.objects.filter(pk=row.pk).update(last_used_at=first - timedelta(minutes=2))
    api.get("/api/queues")
    row.refresh_from_db()
    assert row.last_used_at > first - timedelta(minutes=2)


def test_session_reads_work_and_changes_need_csrf(operator, redis):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.get("/api/queues").status_code == 200
    r = client.post("/api/queues/emails/pause", content_type="application/json")
    assert r.status_code == 403
    assert "CSRF" in r.json()["detail"]
    assert not redis.exists(QueueKeys.for_queue("emails").paused)
    # With the token a browser page has, the same change goes through.
    client.get("/admin/login/")  # any page that sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    r = client.post("/api/queues/emails/pause", content_type="application/json", headers={"X-CSRFToken": token})
    assert r.status_code == 200, r.content
    assert redis.exists(QueueKeys.for_queue("emails").paused)


def test_api_keys_need_no_csrf_token(operator):
    _, key = ApiKey.issue(operator)
    client = Client(enforce_csrf_checks=True, headers={"authorization": f"Bearer {key}"})
    assert client.post("/api/queues/emails/pause", content_type="application/json").status_code == 200


def test_session_of_viewer_cannot_change(viewer):
    client = Client()
    client.force_login(viewer)
    assert client.get("/api/queues").status_code == 200
    assert client.post("/api/queues/emails/pause").status_code == 403


def test_docs_and_schema_are_served(db):
    assert Client().get("/api/docs").status_code == 200
    schema = Client().get("/api/openapi.json").json()
    assert schema["info"]["title"] == "Chasqui"
    assert "/api/queues/{queue}/dlq/replay" in schema["paths"]
