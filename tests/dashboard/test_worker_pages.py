"""The Workers pages (list, one worker with its running jobs), quiet and stop, and purging a queue."""

from __future__ import annotations

import pytest
from django.test import Client

from chasqui_core.engine.ops import control
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.models import AuditEntry

from tests.api.helpers import heartbeat
from tests.helpers import TASK

pytestmark = pytest.mark.django_db

Q = "emails"
KEYS = QueueKeys.for_queue(Q)
WID = "box-1:4242:ab12cd"


def _client(user, **kwargs) -> Client:
    c = Client(**kwargs)
    c.force_login(user)
    return c


def _busy_worker(redis, runs: int) -> list:
    heartbeat(redis, [Q], WID, in_flight=runs)
    q = Queue(Q, redis_client=redis)
    jobs = [q.add(TASK, [i, 0]) for i in range(runs)]
    start = now_ms() - 90_000
    for n, job in enumerate(jobs):
        redis.hset(KEYS.running(WID), job.entry_id, start + n)
    return jobs


def test_the_workers_page_lists_workers_with_their_state_and_actions(operator, viewer, redis):
    heartbeat(redis, [Q], WID, in_flight=2)
    heartbeat(redis, [Q], "w-gone", age_ms=300_000)
    html = _client(operator).get("/workers/").content.decode()
    assert f'data-worker="{WID}"' in html and 'data-state="running"' in html
    assert f'action="/workers/{WID}/quiet/"' in html and f'action="/workers/{WID}/stop/"' in html
    assert 'href="/workers/"' in html and 'aria-current="page">Workers' in html
    viewer_html = _client(viewer).get("/workers/").content.decode()
    assert WID in viewer_html and "/quiet/" not in viewer_html and "/stop/" not in viewer_html


def test_no_worker_says_how_to_start_one(viewer):
    html = _client(viewer).get("/workers/").content.decode()
    assert "No worker has a heartbeat" in html and "runworker" in html


def test_one_worker_pages_its_running_jobs_with_links_to_their_job_pages(viewer, redis):
    jobs = _busy_worker(redis, 55)
    c = _client(viewer)
    html = c.get(f"/workers/{WID}/").content.decode()
    assert "Running now" in html and "1–50 of 55" in html
    assert f'href="/jobs/{jobs[0].job_id}/"' in html and f'href="/jobs/{jobs[49].job_id}/"' in html
    assert jobs[50].job_id not in html
    assert "Later starts" in html
    rest = c.get(f"/workers/{WID}/?offset=50").content.decode()
    assert f'href="/jobs/{jobs[54].job_id}/"' in rest and jobs[0].job_id not in rest and "Older starts" in rest
    assert c.get("/workers/nobody/").status_code == 404


def test_quiet_and_stop_from_the_console_are_posts_checked_and_audited(operator, viewer, redis):
    heartbeat(redis, [Q], WID)
    assert _client(viewer).post(f"/workers/{WID}/quiet/").status_code == 403
    assert _client(operator).get(f"/workers/{WID}/quiet/").status_code == 405
    assert _client(operator, enforce_csrf_checks=True).post(f"/workers/{WID}/stop/").status_code == 403
    assert redis.get(control.control_key(WID)) is None
    c = _client(operator)
    r = c.post(f"/workers/{WID}/quiet/", follow=True)
    assert r.status_code == 200 and "asked to quiet down" in r.content.decode()
    assert redis.get(control.control_key(WID)) == b"quiet"
    r = c.post(f"/workers/{WID}/stop/", follow=True)
    assert "asked to stop" in r.content.decode()
    assert redis.get(control.control_key(WID)) == b"stop"
    assert [(e.action, e.source, e.target_ids) for e in AuditEntry.objects.order_by("id")] == [
        ("worker_quiet", "console", [WID]),
        ("worker_stop", "console", [WID]),
    ]


def test_purge_confirms_with_the_count_then_deletes_waiting_jobs_only(operator, viewer, redis):
    q = Queue(Q, redis_client=redis)
    for i in range(9):
        q.add(TASK, [i, 0])
    redis.xgroup_create(KEYS.stream, GROUP, id="0", mkstream=True)
    redis.xreadgroup(GROUP, "w-1", {KEYS.stream: ">"}, count=3)
    assert 'data-action="purge"' in _client(operator).get(f"/queues/{Q}/").content.decode()
    assert 'data-action="purge"' not in _client(viewer).get(f"/queues/{Q}/").content.decode()
    assert _client(viewer).post(f"/queues/{Q}/purge/confirm/").status_code == 403
    assert _client(viewer).post(f"/queues/{Q}/purge/").status_code == 403
    c = _client(operator)
    confirm = c.post(f"/queues/{Q}/purge/confirm/").content.decode()
    assert 'data-confirm-count="6"' in confirm and "Delete 6 waiting jobs from emails?" in confirm
    assert redis.xlen(KEYS.stream) == 9, "the confirmation deletes nothing"
    r = c.post(f"/queues/{Q}/purge/", follow=True)
    assert "Deleted 6 waiting jobs from emails" in r.content.decode()
    assert redis.xlen(KEYS.stream) == 3
    [entry] = AuditEntry.objects.all()
    assert (entry.action, entry.count, entry.source) == ("purge", 6, "console")
    again = c.post(f"/queues/{Q}/purge/confirm/").content.decode()
    assert "No job is waiting" in again


def test_a_workers_running_jobs_of_a_priority_band_say_so(viewer, redis):
    heartbeat(redis, [Q], WID, in_flight=2)
    q = Queue(Q, redis_client=redis)
    urgent, plain = q.add(TASK, [1, 0], priority=70), q.add(TASK, [2, 0])
    start = now_ms() - 5_000
    redis.hset(KEYS.in_band("high").running(WID), urgent.entry_id, start)
    redis.hset(KEYS.running(WID), plain.entry_id, start + 1)
    html = _client(viewer).get(f"/workers/{WID}/").content.decode()
    assert f'href="/jobs/{urgent.job_id}/"' in html and f'href="/jobs/{plain.job_id}/"' in html
    assert html.count('data-band="high"') == 1 and 'title="priority 70">high band<' in html
