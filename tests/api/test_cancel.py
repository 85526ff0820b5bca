"""Cancelling a job through the API, and the progress a running job reports, with a real worker."""

import threading
import time

import pytest
from django.tasks import task_backends

from chasqui_core.task_results import was_cancelled
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.worker import Worker
from chasqui_core.models import AuditEntry
from chasqui_core.task_runner import build_registry
from tests.django import sample_tasks

pytestmark = pytest.mark.django_db

ADD = "tests.django.sample_tasks.add"
PATIENT = "tests.django.sample_tasks.patient"


@pytest.fixture
def result_storage():
    backend = task_backends["default"]
    saved = backend.result_ttl, backend.supports_get_result
    backend.result_ttl, backend.supports_get_result = 60, True
    yield backend
    backend.result_ttl, backend.supports_get_result = saved


class RunningWorker:
    """A worker on the default queue, in a thread of its own (the test client stays on the main thread)."""

    def __init__(self, url: str) -> None:
        self.worker = Worker(["default"], build_registry(), url=url, install_signal_handlers=False,
                             promoter_poll_interval=0.02, cancel_grace=5)
        self.thread = threading.Thread(target=self.worker.run_sync, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + 5
        while self.worker._loop is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.worker.request_stop()
        self.thread.join(30)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def test_a_waiting_job_cancelled_through_the_api_never_runs(op_api, view_api, operator, result_storage, redis_url):
    job_id = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2]}).json()["job_id"]
    r = op_api.post(f"/api/jobs/{job_id}/cancel")
    assert r.status_code == 202, r.content
    body = r.json()
    assert (body["job_id"], body["queue"], body["state"], body["moved_from_delayed"]) == (
        job_id, "default", "waiting", False)
    assert view_api.get(f"/api/jobs/{job_id}").json()["cancel_requested_at"] is not None
    entry = AuditEntry.objects.get(action="cancel_job")
    assert (entry.target_ids, entry.count, entry.actor_id, entry.detail["state"]) == (
        [job_id], 1, operator.pk, "waiting")

    sample_tasks.RUNS.clear()
    with RunningWorker(redis_url):
        found = wait_for(lambda: view_api.get(f"/api/jobs/{job_id}").json()["state"] == "dead", 20,
                         "the job in the dead-letter queue")
    assert found
    body = view_api.get(f"/api/jobs/{job_id}").json()
    assert body["death"]["reason"] == "cancelled" and body["status"] == "FAILED"
    assert sample_tasks.RUNS == []
    result = task_backends["default"].get_result(job_id)
    assert str(result.status) == "FAILED" and was_cancelled(result)
    # dead already: nothing left to cancel
    assert op_api.post(f"/api/jobs/{job_id}/cancel").status_code == 409


def test_a_delayed_job_is_cancelled_at_once(op_api, redis):
    job_id = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2], "delay_ms": 600_000}).json()[
        "job_id"]
    r = op_api.post(f"/api/jobs/{job_id}/cancel")
    assert r.status_code == 202, r.content
    assert r.json()["state"] == "delayed" and r.json()["moved_from_delayed"] is True
    assert redis.zcard(QueueKeys.for_queue("default").delayed) == 0


def test_cancel_needs_the_permission_and_a_known_job(op_api, view_api, outsider_api, redis):
    job_id = op_api.post("/api/queues/default/jobs", {"task": ADD, "args": [1, 2]}).json()["job_id"]
    assert view_api.post(f"/api/jobs/{job_id}/cancel").status_code == 403
    assert outsider_api.post(f"/api/jobs/{job_id}/cancel").status_code == 403
    assert not redis.exists(QueueKeys.for_queue("default").cancel)
    assert op_api.post("/api/jobs/no-such-job/cancel").status_code == 404
    assert not AuditEntry.objects.filter(action="cancel_job").exists()


def test_a_running_sync_job_reports_progress_and_stops_when_cancelled(op_api, view_api, result_storage,
                                                                     redis_url):
    job_id = op_api.post("/api/queues/default/jobs", {"task": PATIENT, "args": ["p1"]}).json()["job_id"]
    sample_tasks.RUNS.clear()
    with RunningWorker(redis_url):
        progress = wait_for(lambda: view_api.get(f"/api/jobs/{job_id}").json()["progress"], 20,
                            "a progress report")
        assert progress["message"].startswith("step ") and progress["value"] >= 0
        backend_progress = task_backends["default"].progress(job_id)
        assert backend_progress is not None and backend_progress.message.startswith("step ")
        r = op_api.post(f"/api/jobs/{job_id}/cancel")
        assert r.status_code == 202 and r.json()["state"] == "running"
        wait_for(lambda: view_api.get(f"/api/jobs/{job_id}").json()["state"] == "dead", 20, "the run to stop")
    result = task_backends["default"].get_result(job_id)
    assert was_cancelled(result)
    assert sample_tasks.RUNS == [("patient", "p1")]
