"""Enqueue by task name, job results, and the task list."""

import asyncio
import time

import pytest
from django.tasks import task_backends

from chasqui_core.task_runner import build_registry
from chasqui_core.engine.jobs.backoff import coerce_backoff
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.worker.worker import Worker
from chasqui_core.models import AuditEntry
from tests.django import sample_tasks

from .helpers import stream_jobs

pytestmark = pytest.mark.django_db

ADD = "tests.django.sample_tasks.add"


def test_task_list_names_the_enqueueable_tasks(view_api):
    r = view_api.get("/api/tasks")
    assert r.status_code == 200
    by_name = {t["name"]: t for t in r.json()}
    assert by_name[ADD] == {"name": ADD, "queue": "default", "max_attempts": None, "parameters": ["a", "b"]}
    assert by_name["tests.django.sample_tasks.flaky"]["parameters"] == ["key", "fail_times"]  # context left out
    assert "emails.tasks.send_welcome_email" in by_name


def test_enqueue_with_options(op_api, operator, redis):
    r = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [2, 3], "attempts": 7, "backoff": 250,
                                                 "job_id": "order-42"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["job_id"] == "order-42" and body["queue"] == "default" and body["task"] == ADD
    [job] = stream_jobs(redis, "default")
    assert (job.id, job.task, job.args, job.max_attempts) == ("order-42", ADD, [2, 3], 7)
    assert job.backoff == coerce_backoff(250).to_dict()
    entry = AuditEntry.objects.get(action="enqueue")
    assert (entry.queue, entry.count, entry.target_ids, entry.actor_id) == ("default", 1, ["order-42"], operator.pk)
    assert entry.detail["task"] == ADD


def test_enqueue_with_delay_goes_to_the_delayed_set(op_api, redis):
    r = op_api.post("/api/queues/default/jobs", {"task": ADD, "kwargs": {"a": 1, "b": 2}, "delay_ms": 60_000})
    assert r.status_code == 201, r.content
    assert r.json()["run_after"] is not None
    assert stream_jobs(redis, "default") == []
    assert redis.zcard(QueueKeys.for_queue("default").delayed) == 1


def test_enqueue_with_a_priority_goes_to_its_band(op_api, redis):
    r = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2], "priority": 40})
    assert r.status_code == 201, r.content
    assert stream_jobs(redis, "default") == []
    [(_, fields)] = redis.xrange(QueueKeys.for_queue("default").in_band("high").stream)
    assert decode(fields[b"j"]).meta["priority"] == 40
    assert AuditEntry.objects.get(action="enqueue").detail["priority"] == 40
    r = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2], "priority": 101})
    assert r.status_code == 422


def test_enqueue_on_another_served_queue(op_api, redis):
    r = op_api.post("/api/queues/emails/jobs", {"task": ADD, "args": [1, 1]})
    assert r.status_code == 201
    assert [j.task for j in stream_jobs(redis, "emails")] == [ADD]


def test_enqueue_bad_input_is_422_and_enqueues_nothing(op_api, redis):
    cases = [
        ({"task": "os.system", "args": ["rm -rf /"]}, "Unknown task"),
        ({"task": ADD, "args": [1]}, "missing a required argument"),
        ({"task": ADD, "args": [1, 2], "kwargs": {"c": 3}}, "unexpected keyword"),
        ({"task": ADD, "args": [1, 2], "attempts": 0}, "attempts"),
        ({"task": ADD, "args": [1, 2], "delay_ms": -5}, "delay_ms"),
        ({"task": ADD, "args": [1, 2], "backoff": "sideways"}, "backoff"),
        ({"task": ADD, "args": [1, 2], "job_id": ""}, "job_id"),
        ({"task": ADD, "args": [2 ** 70, 1]}, ""),
        ({"args": [1, 2]}, "task"),
        ({"task": ADD, "args": "12"}, "args"),
    ]
    for body, words in cases:
        r = op_api.post("/api/queues/default/jobs", body)
        assert r.status_code == 422, (body, r.content)
        assert words in r.json()["detail"], (body, r.json())
    assert stream_jobs(redis, "default") == []
    assert not AuditEntry.objects.exists()


def test_enqueue_on_a_queue_the_backend_does_not_serve(op_api, redis):
    redis.sadd(QUEUES_REGISTRY, "legacy")
    r = op_api.post("/api/queues/legacy/jobs", {"task": ADD, "args": [1, 2]})
    assert r.status_code == 422
    assert "not served" in r.json()["detail"]


@pytest.fixture
def result_storage():
    backend = task_backends["default"]
    saved = backend.result_ttl, backend.supports_get_result
    backend.result_ttl, backend.supports_get_result = 60, True
    yield backend
    backend.result_ttl, backend.supports_get_result = saved


def test_job_result_when_storage_is_off_says_so(view_api):
    r = view_api.get("/api/jobs/whatever")
    assert r.status_code == 404
    assert "RESULT_TTL" in r.json()["detail"]


def test_job_result_ready_then_successful(op_api, view_api, result_storage, redis_url):
    job_id = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [20, 22]}).json()["job_id"]
    r = view_api.get(f"/api/jobs/{job_id}")
    assert r.status_code == 200, r.content
    assert r.json()["status"] == "READY"
    sample_tasks.RUNS.clear()
    worker = Worker(["default"], build_registry(), url=redis_url, install_signal_handlers=False,
                    promoter_poll_interval=0.02)

    async def run():
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 20
        while not sample_tasks.RUNS and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        worker.request_stop()
        await runner

    asyncio.run(run())
    body = view_api.get(f"/api/jobs/{job_id}").json()
    assert body["status"] == "SUCCESSFUL"
    assert body["return_value"] == 42
    assert body["args"] == [20, 22]
    assert view_api.get("/api/jobs/no-such-job").status_code == 404


# --- finding a job in any state ----------------------------------------------------------------

def test_a_lookup_reads_where_the_id_leads_and_says_what_it_left_unless_asked_to_search_all(view_api, redis):
    # 5,000 waiting jobs: an unknown id is answered from the 4,000 entries around the time in it, and the 404
    # says what was left unread; search=all reads everything and is sure. A caller-given id far from that
    # time is found at the entry its marker names.
    from chasqui_core.engine.jobs.envelope import new_job_id
    from chasqui_core.engine.producer.queue import JobSpec, Queue

    q = Queue("default", redis_client=redis)
    unknown, given = new_job_id(), new_job_id()
    q.add_bulk(JobSpec(ADD, [i, i]) for i in range(5_000))
    q.add(ADD, [1, 2], job_id=given)
    near = view_api.get(f"/api/jobs/{unknown}")
    assert near.status_code == 404, near.content
    assert "not read: the rest of the stream of default" in near.json()["detail"]
    assert "?search=all" in near.json()["detail"]
    everywhere = view_api.get(f"/api/jobs/{unknown}?search=all")
    assert everywhere.status_code == 404 and "No job" in everywhere.json()["detail"]
    found = view_api.get(f"/api/jobs/{given}")
    assert found.status_code == 200, found.content
    assert (found.json()["state"], found.json()["args"]) == ("waiting", [1, 2])
    assert any("the entry it was added at: found" in place for place in found.json()["searched"])
    assert view_api.get(f"/api/jobs/{given}?search=everywhere").status_code == 422


def test_an_unknown_id_with_nothing_left_unread_is_a_definite_404(view_api):
    r = view_api.get("/api/jobs/01J000000000000000000000ZZ")
    assert r.status_code == 404
    assert "No job" in r.json()["detail"] and "search=all" not in r.json()["detail"]


def test_find_a_waiting_job_with_its_arguments_masked(op_api, view_api):
    body = {"task": ADD, "args": [{"password": "hunter2"}, 2]}
    job_id = op_api.post("/api/queues/default/jobs", body).json()["job_id"]
    body = view_api.get(f"/api/jobs/{job_id}").json()
    assert (body["state"], body["status"], body["queue"], body["task"]) == ("waiting", "READY", "default", ADD)
    assert body["args"] == [{"password": "••••••"}, 2]
    assert body["stream_entry"] and body["scanned"] >= 1 and body["searched"]


def test_find_a_delayed_job(op_api, view_api):
    body = {"task": ADD, "args": [1, 2], "delay_ms": 600_000}
    job_id = op_api.post("/api/queues/default/jobs", body).json()["job_id"]
    body = view_api.get(f"/api/jobs/{job_id}").json()
    assert (body["state"], body["status"]) == ("delayed", "READY")
    assert body["run_at"] is not None
    assert body["priority"] == 0, "a job added without one has the default priority"


@pytest.mark.parametrize("priority", [-40, 75])
def test_a_jobs_priority_is_in_its_detail(view_api, redis, priority):
    from chasqui_core.engine.producer.queue import Queue

    job = Queue("default", redis_client=redis).add(ADD, [1, 2], delay=600, priority=priority)
    body = view_api.get(f"/api/jobs/{job.job_id}").json()
    assert (body["state"], body["priority"]) == ("delayed", priority)


def test_find_a_running_job_from_its_workers_heartbeat(op_api, view_api, redis):
    from .helpers import heartbeat, server_ms

    job_id = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2]}).json()["job_id"]
    started = server_ms(redis) - 5_000
    heartbeat(redis, ["default"], "box-1:4242:ab", in_flight=1, current=[(ADD, job_id, started)])
    body = view_api.get(f"/api/jobs/{job_id}").json()
    assert (body["state"], body["status"], body["worker"]) == ("running", "RUNNING", "box-1:4242:ab")
    assert body["started_at"] is not None and body["args"] == [1, 2]


def test_find_a_dead_job_with_its_errors_masked(view_api, redis):
    from tests.helpers import add_dead, dead_job

    job = dead_job(messages=("login failed password=hunter2",), kwargs={"token": "abc"})
    entry = add_dead(redis, "default", job)
    body = view_api.get(f"/api/jobs/{job.id}").json()
    assert (body["state"], body["status"]) == ("dead", "FAILED")
    assert body["death"]["entry_id"] == entry and body["death"]["reason"] == "retries_exhausted"
    assert "hunter2" not in str(body) and body["kwargs"] == {"token": "••••••"}
    assert len(body["errors"]) == 1


def test_find_a_finished_job_by_its_result(view_api, redis):
    from chasqui_core.engine.jobs.envelope import new_job_id
    from chasqui_core.engine.jobs.results import encode_result

    job_id = new_job_id()
    redis.sadd(QUEUES_REGISTRY, "default")
    redis.set(QueueKeys.for_queue("default").result + job_id,
              encode_result(job_id=job_id, task=ADD, status="SUCCESSFUL", args=[1, 2], kwargs={}, enqueued_at=1,
                            finished_at=2, return_value={"secret": "s3"}))
    body = view_api.get(f"/api/jobs/{job_id}").json()
    assert (body["state"], body["status"], body["return_value"]) == ("finished", "SUCCESSFUL", {"secret": "••••••"})


def test_a_job_found_nowhere_is_404_saying_where_it_looked(view_api):
    r = view_api.get("/api/jobs/01JZZZZZZZZZZZZZZZZZZZZZZZ")
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert "not waiting, running, delayed or dead" in detail and "delayed set of default" in detail
    assert view_api.get(f"/api/jobs/{'x' * 201}").status_code == 422


@pytest.mark.parametrize("job_id", ["a/b", "..", ".", "line\nbreak", "nul\x00", "right\u202eleft", "zero\u200bwidth",
                                    "x" * 201])
def test_a_job_id_the_api_could_not_address_is_refused_in_words(op_api, redis, job_id):
    r = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2], "job_id": job_id})
    assert r.status_code == 422, r.content
    assert "a job id is 1 to 200 characters, without '/', control characters" in r.json()["detail"]
    assert stream_jobs(redis, "default") == []


def test_every_job_id_the_api_takes_can_be_found_again_by_its_url(op_api, view_api):
    from urllib.parse import quote

    for job_id in ("order 42", "...", "ünïcode-✓", "a?b#c%d", "x" * 200):
        r = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2], "job_id": job_id})
        assert r.status_code == 201, (job_id, r.content)
        found = view_api.get(f"/api/jobs/{quote(job_id, safe='')}")
        assert found.status_code == 200 and found.json()["id"] == job_id, job_id


def test_a_job_id_path_outside_the_rule_is_422_not_a_search(view_api):
    r = view_api.get("/api/jobs/right%E2%80%AEleft")
    assert r.status_code == 422 and "a job id is 1 to 200 characters" in r.json()["detail"]
