"""Schedules through the API: listed with their state, paused, resumed and run by hand, each change audited."""

import pytest

from chasqui_core.engine.timing import scheduler
from chasqui_core.engine.store.keys import schedule_state
from chasqui_core.models import AuditEntry

from .helpers import server_ms, stream_jobs

ADD = "tests.django.sample_tasks.add"


@pytest.fixture(autouse=True)
def schedules(settings):
    settings.CHASQUI = {"SCHEDULES": {
        "sums": {"task": ADD, "every": 60, "args": [2, 3], "attempts": 2, "misfire": "run_once"},
        "nightly": {"task": ADD, "cron": "0 3 * * *", "timezone": "America/Lima", "kwargs": {"a": 1, "b": 2,
                                                                                               "token": "s3cret"}},
    }}


def test_the_list_shows_each_schedule_its_timing_and_next_fire(view_api, redis):
    r = view_api.get("/api/schedules")
    assert r.status_code == 200
    items = {s["name"]: s for s in r.json()["items"]}
    assert set(items) == {"sums", "nightly"}
    sums, nightly = items["sums"], items["nightly"]
    assert (sums["task"], sums["queue"], sums["timing"], sums["every"], sums["attempts"]) == (
        ADD, "default", "every 60 s", 60, 2)
    assert (nightly["cron"], nightly["timezone"], nightly["misfire"]) == ("0 3 * * *", "America/Lima", "skip")
    assert nightly["kwargs"]["token"] != "s3cret", "job data is masked like everywhere else"
    assert sums["next_fire"] is not None and sums["recent"] == [] and sums["last_fire"] is None
    assert view_api.get("/api/schedules/nightly").json()["name"] == "nightly"
    missing = view_api.get("/api/schedules/weekly")
    assert missing.status_code == 404 and "sums" in missing.json()["detail"]


def test_run_now_adds_a_job_with_the_schedules_arguments_and_retry_budget(op_api, redis):
    r = op_api.post("/api/schedules/sums/run")
    assert r.status_code == 200
    fire = r.json()
    assert fire["how"] == "manual" and fire["by"] == "olga" and fire["job_id"].startswith("schedule:sums:manual:")
    (job,) = stream_jobs(redis, "default")
    assert (job.id, job.task, job.args, job.max_attempts) == (fire["job_id"], ADD, [2, 3], 2)
    listed = op_api.get("/api/schedules/sums").json()
    assert listed["last_fire"]["job_id"] == fire["job_id"]
    assert listed["fired"] == 0, "a fire by hand is not one of the scheduler's"
    entry = AuditEntry.objects.get(action=AuditEntry.Action.SCHEDULE_RUN)
    assert (entry.target_ids, entry.detail["schedule"], entry.source) == ([fire["job_id"]], "sums", "api")


def test_pause_and_resume_are_recorded_and_shown(op_api, redis):
    assert op_api.post("/api/schedules/nightly/pause").json() == {"schedule": "nightly", "paused": True,
                                                                    "changed": True}
    assert op_api.post("/api/schedules/nightly/pause").json()["changed"] is False
    shown = op_api.get("/api/schedules/nightly").json()
    assert shown["paused"] is True and shown["paused_by"] == "olga" and shown["next_fire"] is None
    assert op_api.post("/api/schedules/nightly/resume").json()["changed"] is True
    assert op_api.get("/api/schedules/nightly").json()["paused"] is False
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "count"))
    assert actions == [("schedule_pause", 1), ("schedule_pause", 0), ("schedule_resume", 1)]


def test_each_fire_shows_how_its_job_went(op_api, redis):
    """The scheduler's fire records, and the job outcomes the worker stored under each job id."""
    from chasqui_core.engine.store.keys import QueueKeys
    from chasqui_core.engine.jobs.results import encode_result

    now = server_ms(redis)
    done = scheduler.FireRecord(now - 120_000, now - 120_000, "schedule:sums:1", "default", "on_time")
    failed = scheduler.FireRecord(now - 60_000, now - 59_000, "schedule:sums:2", "default", "late")
    waiting = scheduler.FireRecord(now, now, "schedule:sums:3", "default", "catch_up")
    for record in (done, failed, waiting):
        redis.lpush("{chasqui:schedules}:fires:sums", record.to_json())
    keys = QueueKeys.for_queue("default")
    for job_id, status in (("schedule:sums:1", "SUCCESSFUL"), ("schedule:sums:2", "FAILED")):
        redis.set(keys.result + job_id, encode_result(job_id=job_id, task=ADD, status=status, args=[2, 3], kwargs={},
                                                      enqueued_at=now))
    recent = op_api.get("/api/schedules/sums").json()["recent"]
    assert [(f["job_id"], f["how"], f["outcome"]) for f in recent] == [
        ("schedule:sums:3", "catch_up", "UNKNOWN"), ("schedule:sums:2", "late", "FAILED"),
        ("schedule:sums:1", "on_time", "SUCCESSFUL")]
    assert redis.exists(schedule_state("sums")) == 0  # reading never writes


def test_permissions(view_api, outsider_api, anon_api, redis):
    assert view_api.post("/api/schedules/sums/pause").status_code == 403
    assert view_api.post("/api/schedules/sums/run").status_code == 403
    assert outsider_api.get("/api/schedules").status_code == 403
    assert anon_api.get("/api/schedules").status_code == 401
    assert stream_jobs(redis, "default") == [] and not AuditEntry.objects.exists()


def test_bad_schedules_in_settings_are_reported_not_crashed_on(view_api, settings):
    settings.CHASQUI = {"SCHEDULES": {"typo": {"task": "tests.django.sample_tasks.nope", "every": 5}}}
    r = view_api.get("/api/schedules")
    assert r.status_code == 422
    assert "settings.CHASQUI['SCHEDULES']['typo']['task']" in r.json()["detail"]
