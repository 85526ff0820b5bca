"""The DLQ endpoints: browse, filter, group, one entry, replay and discard (inline)."""

from datetime import datetime, UTC

import pytest

from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.models import AuditEntry

from tests.helpers import TASK, add_dead, bulk_dead, dead_job

from .helpers import dlq_len, stream_jobs

pytestmark = pytest.mark.django_db

Q = "default"


def test_page_newest_first_with_cursor(view_api, redis):
    ids = bulk_dead(redis, Q, 7)
    r = view_api.get(f"/api/queues/{Q}/dlq", limit=3)
    assert r.status_code == 200, r.content
    page1 = r.json()
    assert [i["entry_id"] for i in page1["items"]] == ids[::-1][:3]
    assert page1["next_cursor"]
    page2 = view_api.get(f"/api/queues/{Q}/dlq", limit=3, cursor=page1["next_cursor"]).json()
    page3 = view_api.get(f"/api/queues/{Q}/dlq", limit=3, cursor=page2["next_cursor"]).json()
    seen = [i["entry_id"] for p in (page1, page2, page3) for i in p["items"]]
    assert seen == ids[::-1]
    assert page3["next_cursor"] is None
    item = page1["items"][0]
    assert item["task"] == "tests.django.sample_tasks.add"
    assert item["reason"] == "retries_exhausted"
    assert item["error"] == "row 6 failed"
    assert item["attempts"] == 1 and item["replayable"] is True


def test_filters(view_api, redis):
    add_dead(redis, Q, task="a.task", messages=("connection refused",), cls="ConnectionError")
    add_dead(redis, Q, task="b.task", messages=("x", "disk full"), cls="OSError")
    add_dead(redis, Q, task="b.task", messages=("bad data",), cls="ValueError", reason="unrecoverable")
    add_dead(redis, Q, task="c.task", messages=("no delay",), cls="InvalidRetry", reason="internal")

    def tasks(**params):
        r = view_api.get(f"/api/queues/{Q}/dlq", **params)
        assert r.status_code == 200, r.content
        return sorted((i["task"], i["error_class"]) for i in r.json()["items"])

    assert tasks(task="b.task") == [("b.task", "OSError"), ("b.task", "ValueError")]
    assert tasks(reason="unrecoverable") == [("b.task", "ValueError")]
    assert tasks(reason="internal") == [("c.task", "InvalidRetry")], "every reason the worker writes can be filtered"
    assert tasks(error_class="ConnectionError") == [("a.task", "ConnectionError")]
    assert tasks(error_text="DISK") == [("b.task", "OSError")]
    assert tasks(error_text="x") == [("b.task", "OSError")]  # an earlier attempt's message
    assert tasks(since="2000-01-01T00:00:00Z", until="2001-01-01T00:00:00") == []
    assert len(tasks(since="2000-01-01T00:00:00Z")) == 4


def test_bad_filters_and_paging_are_422(view_api, redis):
    for params, words in [
        ({"reason": "tired"}, "reason"),
        ({"limit": 501}, "limit"),
        ({"limit": 0}, "limit"),
        ({"cursor": "yesterday"}, "cursor"),
        ({"since": "not a date"}, "since"),
        ({"since": "2020-01-02T00:00:00Z", "until": "2020-01-01T00:00:00Z"}, "since"),
    ]:
        r = view_api.get(f"/api/queues/{Q}/dlq", **params)
        assert r.status_code == 422, (params, r.content)
        assert words in r.json()["detail"], r.json()


def test_one_entry_with_history(view_api, redis):
    job = dead_job(messages=("first", "second", "third"), kwargs={"user": 7})
    eid = add_dead(redis, Q, job)
    r = view_api.get(f"/api/queues/{Q}/dlq/{eid}")
    assert r.status_code == 200
    body = r.json()
    assert body["job_id"] == job.id
    assert [e["message"] for e in body["errors"]] == ["first", "second", "third"]
    assert "Traceback" in body["errors"][0]["traceback"]
    assert body["kwargs"] == {"user": 7}
    assert view_api.get(f"/api/queues/{Q}/dlq/1-0").status_code == 404
    bad = view_api.get(f"/api/queues/{Q}/dlq/not-an-id")
    assert bad.status_code == 422
    assert "entry id" in bad.json()["detail"]


def test_groups(view_api, redis):
    for i in range(3):
        add_dead(redis, Q, messages=(f"user {i} not found",), cls="LookupError")
    add_dead(redis, Q, messages=("timeout",), cls="TimeoutError")
    r = view_api.get(f"/api/queues/{Q}/dlq/groups")
    assert r.status_code == 200
    groups = r.json()["items"]
    assert [(g["error_class"], g["count"]) for g in groups] == [("LookupError", 3), ("TimeoutError", 1)]
    assert groups[0]["first_seen_ms"] <= groups[0]["last_seen_ms"]
    assert groups[0]["tasks"] == ["tests.django.sample_tasks.add"]
    only = view_api.get(f"/api/queues/{Q}/dlq/groups", error_class="TimeoutError").json()["items"]
    assert [g["count"] for g in only] == [1]
    one = view_api.get(f"/api/queues/{Q}/dlq/groups", fingerprint=groups[0]["fingerprint"]).json()["items"]
    assert [(g["fingerprint"], g["count"]) for g in one] == [("LookupError: user <n> not found", 3)]
    # the whole DLQ is grouped from its index; a text filter groups the newest entries it scans
    assert {k: r.json()[k] for k in ("whole", "total_groups", "other_entries")} == {
        "whole": True, "total_groups": 2, "other_entries": 0}
    assert view_api.get(f"/api/queues/{Q}/dlq/groups", error_text="user").json()["whole"] is False


def test_list_filtered_by_fingerprint(view_api, redis):
    lookups = [add_dead(redis, Q, messages=(f"user {i} not found",), cls="LookupError") for i in range(3)]
    add_dead(redis, Q, messages=("user 9 not found",), cls="KeyError")  # same message, other class
    add_dead(redis, Q, messages=("user 9 gone",), cls="LookupError")  # same class, other message
    [group] = [g for g in view_api.get(f"/api/queues/{Q}/dlq/groups").json()["items"] if g["count"] == 3]
    r = view_api.get(f"/api/queues/{Q}/dlq", fingerprint=group["fingerprint"])
    assert r.status_code == 200, r.content
    items = r.json()["items"]
    assert [i["entry_id"] for i in items] == lookups[::-1]
    assert {i["fingerprint"] for i in items} == {"LookupError: user <n> not found"}
    # exact match only: no prefix, no case folding; combined with the other filters
    assert view_api.get(f"/api/queues/{Q}/dlq", fingerprint="LookupError: user <n>").json()["items"] == []
    assert view_api.get(f"/api/queues/{Q}/dlq", fingerprint="lookuperror: user <n> not found").json()["items"] == []
    assert view_api.get(f"/api/queues/{Q}/dlq", fingerprint=group["fingerprint"],
                        task="other.task").json()["items"] == []
    paged = view_api.get(f"/api/queues/{Q}/dlq", fingerprint=group["fingerprint"], limit=2).json()
    rest = view_api.get(f"/api/queues/{Q}/dlq", fingerprint=group["fingerprint"], limit=2,
                        cursor=paged["next_cursor"]).json()
    assert [i["entry_id"] for i in paged["items"] + rest["items"]] == lookups[::-1]
    assert rest["next_cursor"] is None
    long = view_api.get(f"/api/queues/{Q}/dlq", fingerprint="x" * 1001)
    assert long.status_code == 422 and "fingerprint" in long.json()["detail"]


def test_replay_by_ids_resets_attempts_and_is_audited(op_api, operator, redis):
    ids = bulk_dead(redis, Q, 5)
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"ids": ids[:3]})
    assert r.status_code == 200, r.content
    assert r.json() == {"background": False, "count": 3, "operation": None}
    jobs = stream_jobs(redis, Q)
    assert len(jobs) == 3 and all(j.attempt == 0 and j.replays == 1 for j in jobs)
    assert dlq_len(redis, Q) == 2
    entry = AuditEntry.objects.get(action="replay")
    assert (entry.count, entry.queue, entry.target_ids, entry.actor_id) == (3, Q, ids[:3], operator.pk)
    # the same ids again: nothing left to replay
    again = op_api.post(f"/api/queues/{Q}/dlq/replay", {"ids": ids[:3]})
    assert again.json()["count"] == 0
    assert len(stream_jobs(redis, Q)) == 3


def test_replay_one_more_attempt_at_a_time(op_api, redis):
    eid = add_dead(redis, Q, messages=("a", "b", "c"))
    when = datetime(2030, 1, 1, tzinfo=UTC)
    r = op_api.post(f"/api/queues/{Q}/dlq/{eid}/replay", {"reset_attempts": False, "run_at": when.isoformat()})
    assert r.status_code == 200, r.content
    assert r.json()["count"] == 1
    assert stream_jobs(redis, Q) == []
    [(member, score)] = redis.zrange(QueueKeys.for_queue(Q).delayed, 0, -1, withscores=True)
    assert score == when.timestamp() * 1000
    from chasqui_core.engine.jobs.envelope import decode

    job = decode(member)
    assert (job.attempt, job.max_attempts) == (3, 4)
    # gone now: 404
    assert op_api.post(f"/api/queues/{Q}/dlq/{eid}/replay").status_code == 404


def test_replay_by_filter_inline(op_api, redis):
    bulk_dead(redis, Q, 4, task="a.task")
    bulk_dead(redis, Q, 6, task="b.task")
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"task": "b.task"}})
    assert r.status_code == 200, r.content
    assert r.json()["count"] == 6
    assert sorted({j.task for j in stream_jobs(redis, Q)}) == ["b.task"]
    entry = AuditEntry.objects.get(action="replay")
    assert entry.count == 6
    assert entry.filter == {"task": "b.task"}


def test_a_few_matches_of_free_text_over_a_big_dlq_go_to_a_worker_not_the_request(op_api, redis):
    """Seven matches, but only a read of the whole DLQ finds them: the request must not do that read."""
    bulk_dead(redis, Q, 15_000, message="row {i} failed")  # more than the confirmation's bounded read
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"error_text": "row 14321 failed"}})
    assert r.status_code == 202, r.content
    assert r.json()["background"] is True
    assert dlq_len(redis, Q) == 15_000  # nothing moved inside the request
    small = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"task": TASK, "error_text": "nothing"}})
    assert small.status_code == 202  # an indexed value with free text: still an estimate over 15,000


def test_replay_and_discard_one_error_group_by_fingerprint(op_api, redis):
    timeouts = [add_dead(redis, Q, messages=(f"gateway timed out for order {i}",), cls="TimeoutError")
                for i in range(4)]
    others = [add_dead(redis, Q, messages=("gateway timed out",), cls="TimeoutError"),
              add_dead(redis, Q, messages=("gateway timed out for order 7",), cls="OSError")]
    declined = [add_dead(redis, Q, messages=(f"card {i} declined",), cls="CardDeclined") for i in range(2)]
    groups = {g["fingerprint"]: g["count"] for g in op_api.get(f"/api/queues/{Q}/dlq/groups").json()["items"]}
    fp = "TimeoutError: gateway timed out for order <n>"
    assert groups[fp] == 4
    r = op_api.post(f"/api/queues/{Q}/dlq/replay", {"filter": {"fingerprint": fp}, "reset_attempts": False})
    assert r.status_code == 200, r.content
    assert r.json() == {"background": False, "count": 4, "operation": None}
    left = {e.decode() for e, _ in redis.xrange(QueueKeys.for_queue(Q).dlq)}
    assert left == set(others + declined) and left.isdisjoint(timeouts)  # exactly the group's entries went
    jobs = stream_jobs(redis, Q)
    assert sorted(j.errors[-1]["message"] for j in jobs) == [f"gateway timed out for order {i}" for i in range(4)]
    assert all(j.max_attempts == j.attempt + 1 for j in jobs)
    entry = AuditEntry.objects.get(action="replay")
    assert (entry.count, entry.filter) == (4, {"fingerprint": fp})
    gone = op_api.post(f"/api/queues/{Q}/dlq/discard",
                       {"filter": {"fingerprint": "CardDeclined: card <n> declined", "task": TASK}})
    assert gone.status_code == 200 and gone.json()["count"] == 2
    assert {e.decode() for e, _ in redis.xrange(QueueKeys.for_queue(Q).dlq)} == set(others)
    assert AuditEntry.objects.get(action="discard").filter == {"fingerprint": "CardDeclined: card <n> declined",
                                                               "task": TASK}


def test_discard_by_ids_filter_and_one(op_api, redis):
    ids = bulk_dead(redis, Q, 5, task="a.task")
    bulk_dead(redis, Q, 3, task="b.task")
    assert op_api.post(f"/api/queues/{Q}/dlq/discard", {"ids": ids[:2]}).json()["count"] == 2
    assert op_api.post(f"/api/queues/{Q}/dlq/discard", {"filter": {"task": "b.task"}}).json()["count"] == 3
    r = op_api.post(f"/api/queues/{Q}/dlq/{ids[2]}/discard")
    assert r.status_code == 200 and r.json()["count"] == 1
    assert op_api.post(f"/api/queues/{Q}/dlq/{ids[2]}/discard").status_code == 404
    assert dlq_len(redis, Q) == 2
    assert stream_jobs(redis, Q) == []
    assert [e.count for e in AuditEntry.objects.filter(action="discard").order_by("id")] == [2, 3, 1]


def test_replay_and_discard_bad_input_is_422(op_api, redis):
    ids = bulk_dead(redis, Q, 2)
    cases = [
        ({}, "either"),
        ({"ids": ids, "filter": {}}, "either"),
        ({"ids": []}, "ids"),
        ({"ids": ["nonsense"]}, "entry id"),
        ({"filter": {"reason": "bored"}}, "reason"),
        ({"filter": {"fingerprint": "x" * 1001}}, "fingerprint"),
        ({"filter": {"since": "2021-01-02T00:00:00Z", "until": "2021-01-01T00:00:00Z"}}, "since"),
        ({"filter": {}, "reset_attempts": "maybe"}, "reset_attempts"),
        ({"filter": {}, "run_at": "soon"}, "run_at"),
        ({"ids": ids, "run_at": "1900-01-01T00:00:00Z"}, "1970"),
    ]
    for body, words in cases:
        r = op_api.post(f"/api/queues/{Q}/dlq/replay", body)
        assert r.status_code == 422, (body, r.content)
        assert words in r.json()["detail"], (body, r.json())
    r = op_api.post(f"/api/queues/{Q}/dlq/discard", {"ids": "1-0"})
    assert r.status_code == 422
    r = op_api.client.post(f"/api/queues/{Q}/dlq/discard", data="{not json", content_type="application/json")
    assert r.status_code in (400, 422)
    assert dlq_len(redis, Q) == 2
    assert not AuditEntry.objects.exists()


def test_undecodable_entry_can_be_seen_and_discarded_not_replayed(op_api, redis):
    redis.sadd(QUEUES_REGISTRY, Q)
    eid = redis.xadd(QueueKeys.for_queue(Q).dlq, {"j": b"\xc1garbage", "reason": "decode_failed", "task": "",
                                                    "job_id": "", "source_id": "5-0", "error_class": "DecodeError",
                                                    "error": "not a job"}).decode()
    body = op_api.get(f"/api/queues/{Q}/dlq/{eid}").json()
    assert body["replayable"] is False and body["args"] is None
    assert op_api.post(f"/api/queues/{Q}/dlq/{eid}/replay").status_code == 404
    assert op_api.post(f"/api/queues/{Q}/dlq/{eid}/discard").json()["count"] == 1
