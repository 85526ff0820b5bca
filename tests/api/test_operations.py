"""Big replays and discards by filter: background operations run by the queue's workers (here the same engine
code in a thread, which does not run the replayed jobs), progress, cancel, concurrency."""

import io
import threading
import time
import uuid

import pytest
from django.utils import timezone

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.services import background
from chasqui_core.services import dlq as dlq_service

from tests.helpers import OperationsRunner, bulk_dead

from .helpers import dlq_len, stream_jobs

pytestmark = pytest.mark.django_db(transaction=True)

Q = "default"


@pytest.fixture
def runner(redis_url):
    with OperationsRunner(redis_url, [Q]) as r:
        yield r


def poll(api, op_id, timeout=120.0):
    """Poll the operation until it finishes; returns (final body, progress seen)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = api.get(f"/api/operations/{op_id}")
        assert r.status_code == 200, r.content
        body = r.json()
        seen.append((body["done"], body["total"]))
        if body["status"] in ("done", "cancelled", "failed"):
            return body, seen
        time.sleep(0.1)
    raise AssertionError(f"operation {op_id} did not finish in {timeout} s: {seen[-1:]}")


def test_replay_of_20000_by_filter_runs_in_background_to_the_end(op_api, operator, redis, runner):
    bulk_dead(redis, Q, 20_000)
    dead_job_ids = {decode(f[b"j"]).id for _, f in redis.xrange(QueueKeys.for_queue(Q).dlq)}
    assert len(dead_job_ids) == 20_000
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"task": "tests.django.sample_tasks.add"}})
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["background"] is True and body["count"] is None
    assert body["operation"]["total"] == 20_000
    op_id = body["operation"]["id"]
    final, seen = poll(op_api, op_id)
    assert final["status"] == "done", final
    assert (final["done"], final["total"], final["count"]) == (20_000, 20_000, 20_000)
    dones = [d for d, _ in seen]
    assert dones == sorted(dones)  # progress only moves forward
    jobs = stream_jobs(redis, Q)
    assert len(jobs) == 20_000
    assert sorted(j.id for j in jobs) == sorted(dead_job_ids)  # each entry back exactly once
    assert dlq_len(redis, Q) == 0
    entry = AuditEntry.objects.get(action="replay")
    assert (entry.count, entry.queue, entry.source, entry.actor_id) == (20_000, Q, "api", operator.pk)
    assert entry.filter == {"task": "tests.django.sample_tasks.add"}
    assert entry.detail["operation"] == op_id and entry.detail["status"] == "done"
    listed = op_api.get("/api/operations", status="done").json()["items"]
    assert [o["id"] for o in listed] == [op_id]


def test_two_concurrent_background_replays_move_each_entry_once(op_api, operator, redis, settings, redis_url):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 100}
    bulk_dead(redis, Q, 6_000)
    first = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {}}).json()["operation"]["id"]
    second = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"error_class": "ValueError"}}).json()[
        "operation"]["id"]
    with OperationsRunner(redis_url, [Q]), OperationsRunner(redis_url, [Q]):  # two workers
        a, _ = poll(op_api, first)
        b, _ = poll(op_api, second)
    assert a["status"] == b["status"] == "done"
    jobs = stream_jobs(redis, Q)
    assert len(jobs) == 6_000
    assert len({j.id for j in jobs}) == 6_000
    assert a["count"] + b["count"] == 6_000
    counts = sorted(e.count for e in AuditEntry.objects.filter(action="replay"))
    assert sum(counts) == 6_000 and len(counts) == 2


def test_two_concurrent_inline_replays_move_each_entry_once(operator, redis):
    bulk_dead(redis, Q, 1_500)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def run():
        try:
            barrier.wait()
            results.append(dlq_service.replay(operator, Q, filter={}, source="console", background=False))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    jobs = stream_jobs(redis, Q)
    assert len(jobs) == len({j.id for j in jobs}) == 1_500
    assert sum(results) == 1_500
    assert sorted(e.count for e in AuditEntry.objects.filter(action="replay")) == sorted(results)


def test_cancel_stops_between_chunks_and_keeps_what_was_done(op_api, operator, redis, runner):
    bulk_dead(redis, Q, 3_000)
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {}, "rate": 1000})
    assert r.status_code == 202, r.content
    op_id = r.json()["operation"]["id"]
    assert r.json()["operation"]["options"]["rate"] == 1000
    deadline = time.monotonic() + 30
    while op_api.get(f"/api/operations/{op_id}").json()["done"] == 0:
        assert time.monotonic() < deadline, "the paced replay did not start"
        time.sleep(0.05)
    r = op_api.post(f"/api/operations/{op_id}/cancel")
    assert r.status_code == 200, r.content
    assert r.json()["cancel_requested"] is True
    final, _ = poll(op_api, op_id)
    assert final["status"] == "cancelled"
    assert 0 < final["count"] < 3_000
    replayed = len(stream_jobs(redis, Q))
    assert replayed == final["count"]
    assert replayed + dlq_len(redis, Q) == 3_000  # nothing lost, nothing half-moved
    audit = AuditEntry.objects.get(action="replay")
    assert audit.count == final["count"] and audit.detail["status"] == "cancelled"
    assert AuditEntry.objects.get(action="cancel_operation").target_ids == [op_id]
    # finished: cancelling again conflicts
    again = op_api.post(f"/api/operations/{op_id}/cancel")
    assert again.status_code == 409
    assert "finished" in again.json()["detail"]


def test_background_discard_by_filter(op_api, redis, settings, runner):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 100}
    bulk_dead(redis, Q, 800, task="old.task")
    bulk_dead(redis, Q, 50, task="keep.task")
    r = op_api.post(f"/api/queues/{Q}/dlq/discard", {"filter": {"task": "old.task"}})
    assert r.status_code == 202
    final, _ = poll(op_api, r.json()["operation"]["id"])
    assert (final["status"], final["count"], final["total"]) == ("done", 800, 800)
    assert dlq_len(redis, Q) == 50
    assert stream_jobs(redis, Q) == []
    assert AuditEntry.objects.get(action="discard").count == 800


def test_a_big_error_group_replays_in_the_background_by_fingerprint(op_api, redis, settings, runner):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 100}
    group = bulk_dead(redis, Q, 300, cls="TimeoutError", message="order {i} timed out")
    bulk_dead(redis, Q, 40, cls="ValueError", message="order {i} timed out")  # same message, other class
    bulk_dead(redis, Q, 40, cls="TimeoutError", message="order {i} rejected")  # same class, other message
    fp = "TimeoutError: order <n> timed out"
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"fingerprint": fp}})
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["operation"]["filter"] == {"fingerprint": fp} and body["operation"]["total"] == 300
    final, _ = poll(op_api, body["operation"]["id"])
    assert (final["status"], final["count"], final["done"], final["total"]) == ("done", 300, 300, 300)
    left = {e.decode() for e, _ in redis.xrange(QueueKeys.for_queue(Q).dlq)}
    assert len(left) == 80 and left.isdisjoint(group)
    jobs = stream_jobs(redis, Q)
    assert len(jobs) == 300 and {j.errors[-1]["class"] for j in jobs} == {"TimeoutError"}
    assert all(j.errors[-1]["message"].endswith(" timed out") for j in jobs)
    entry = AuditEntry.objects.get(action="replay")
    assert (entry.count, entry.filter) == (300, {"fingerprint": fp})


def test_identical_running_operation_conflicts(op_api, operator, redis, settings, runner):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 10}
    bulk_dead(redis, Q, 50)
    running = Operation.objects.create(kind="replay", queue=Q, filter={}, status="running", created_by=operator,
                                       options={"reset_attempts": True, "run_at_ms": None},
                                       updated_at=timezone.now())
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {}})
    assert r.status_code == 409
    assert str(running.pk) in r.json()["detail"]
    assert dlq_len(redis, Q) == 50
    # one whose record Redis lost long ago does not block for ever
    Operation.objects.filter(pk=running.pk).update(created_at=timezone.now() - background.LOST_AFTER * 2)
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {}})
    assert r.status_code == 202
    final, _ = poll(op_api, r.json()["operation"]["id"])
    assert final["count"] == 50
    assert Operation.objects.get(pk=running.pk).status == "failed"


def test_operation_permissions_and_bad_ids(op_api, view_api, operator, redis, settings):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 10}
    done = Operation.objects.create(kind="discard", queue=Q, status="done", created_by=operator)
    assert view_api.get(f"/api/operations/{done.pk}").status_code == 200
    assert view_api.post(f"/api/operations/{done.pk}/cancel").status_code == 403
    assert op_api.post(f"/api/operations/{done.pk}/cancel").status_code == 409
    assert op_api.get(f"/api/operations/{uuid.uuid4()}").status_code == 404
    bad = op_api.get("/api/operations/not-a-uuid")
    assert bad.status_code == 422
    assert op_api.get("/api/operations", status="sleeping").status_code == 422


def test_with_no_worker_an_operation_says_it_waits_and_the_cli_can_run_it(op_api, operator, redis, settings):
    from django.core.management import call_command

    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 10}
    bulk_dead(redis, Q, 120)
    r = op_api.post(f"/api/queues/{Q}/dlq/discard", {"filter": {}})
    assert r.status_code == 202, r.content
    op_id = r.json()["operation"]["id"]
    body = op_api.get(f"/api/operations/{op_id}").json()
    assert (body["status"], body["waiting_for_worker"], body["done"]) == ("pending", True, 0)
    assert dlq_len(redis, Q) == 120
    out = io.StringIO()
    call_command("chasqui", "operations", "--run", Q, stdout=out)
    assert "Ran 1 operation" in out.getvalue()
    body = op_api.get(f"/api/operations/{op_id}").json()
    assert (body["status"], body["count"], body["total"], body["total_exact"]) == ("done", 120, 120, True)
    assert dlq_len(redis, Q) == 0
    assert AuditEntry.objects.get(action="discard").count == 120  # written once, by whoever saw it end first
    op_api.get(f"/api/operations/{op_id}")
    assert AuditEntry.objects.filter(action="discard").count() == 1


def test_a_rate_is_for_replays_by_filter(op_api, redis):
    bulk_dead(redis, Q, 5)
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"ids": ["1-0"], "rate": 10})
    assert r.status_code == 422 and "rate applies to replays by filter" in r.json()["detail"]
    assert op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {}, "rate": 0}).status_code == 422
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {}, "rate": 50})
    assert r.status_code == 202 and r.json()["operation"]["options"]["rate"] == 50  # small, but paced: background


def test_search_reads_the_whole_dlq_and_never_matches_a_masked_secret(op_api, view_api, redis):
    from tests.helpers import add_dead, dead_job

    bulk_dead(redis, Q, 3000)
    rare = add_dead(redis, Q, dead_job(kwargs={"customer": "ACME-7731", "password": "hunter2"}))
    bulk_dead(redis, Q, 3000)
    r = view_api.get(f"/api/queues/{Q}/dlq/search", q="acme-7731")
    assert r.status_code == 200, r.content
    body = r.json()
    assert [i["entry_id"] for i in body["items"]] == [rare]
    assert body["next_cursor"] is None and body["scanned"] == body["total"] == 6001
    assert view_api.get(f"/api/queues/{Q}/dlq/search", q="hunter2").json()["items"] == []
    assert view_api.get(f"/api/queues/{Q}/dlq/search").status_code == 422
    page = view_api.get(f"/api/queues/{Q}/dlq/search", q="row", limit=2).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    more = view_api.get(f"/api/queues/{Q}/dlq/search", q="row", limit=2, cursor=page["next_cursor"]).json()
    assert {i["entry_id"] for i in more["items"]}.isdisjoint(i["entry_id"] for i in page["items"])


def test_a_worker_process_writes_the_audit_entry_of_an_operation_nobody_looks_at(op_api, redis, settings,
                                                                                   monkeypatch):
    from chasqui_core.engine.dlq.operations import run_pending

    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 10}
    bulk_dead(redis, Q, 40)
    op_id = op_api.post(f"/api/queues/{Q}/dlq/discard", {"filter": {}}).json()["operation"]["id"]
    [record] = run_pending(redis, Q, "engine-only")  # the engine alone: it cannot write to the database
    assert record.state == "done" and not AuditEntry.objects.exists()
    monkeypatch.setattr(background.OperationAudits, "EVERY_S", 0.05)
    audits = background.OperationAudits([Q])  # what runworker starts beside the worker
    try:
        deadline = time.monotonic() + 20
        while not AuditEntry.objects.filter(action="discard").exists():
            assert time.monotonic() < deadline, "no audit entry"
            time.sleep(0.05)
    finally:
        audits.stop()
    entry = AuditEntry.objects.get(action="discard")
    assert (entry.count, entry.detail["operation"]) == (40, op_id)
    assert Operation.objects.get(pk=op_id).status == "done"
