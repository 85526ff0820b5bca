"""The job search box, the page of any job, and the list of a queue's stream, through Django's test client."""

from __future__ import annotations

import time
from urllib.parse import unquote

import pytest
from django.test import Client

from bench.console_scale import build_dead
from chasqui_core.engine.jobs.envelope import new_job_id
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.masking import MASK
from tests.helpers import TASK, add_dead, dead_job

pytestmark = pytest.mark.django_db

Q = "emails"


def _client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.mark.parametrize("url", ["/jobs/", "/jobs/01ABC/", f"/queues/{Q}/stream/"])
def test_anonymous_users_are_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_users_without_the_view_permission_are_refused(outsider):
    assert _client(outsider).get("/jobs/01ABC/").status_code == 403


def test_every_console_page_has_the_search_box_and_the_favicon(viewer):
    html = _client(viewer).get("/").content.decode()
    assert 'id="job-search"' in html and 'action="/jobs/"' in html
    assert "favicon.svg" in html


def test_the_search_box_goes_to_the_jobs_page(viewer):
    response = _client(viewer).get("/jobs/", {"id": " 01ABC "})
    assert response.status_code == 302 and response["Location"] == "/jobs/01ABC/"


def test_a_job_found_nowhere_says_where_it_looked(viewer, redis):
    Queue(Q, redis_client=redis).add(TASK, [1, 2])
    response = _client(viewer).get(f"/jobs/{new_job_id()}/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "not waiting, running, delayed or dead" in html and "delayed set of emails" in html


def test_a_waiting_jobs_page_shows_its_arguments_masked_and_escaped(viewer, redis):
    added = Queue(Q, redis_client=redis).add(TASK, ["<script>alert(1)</script>"], {"password": "hunter2"})
    html = _client(viewer).get(f"/jobs/{added.job_id}/").content.decode()
    assert 'data-state="waiting"' in html
    assert "hunter2" not in html and MASK in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Replay" not in html and "Run now" not in html  # nothing to do for a waiting job


def test_a_dead_jobs_page_offers_replay_and_discard_to_operators_only(operator, viewer, redis):
    job = dead_job(messages=("token=abc123 refused",))
    entry = add_dead(redis, Q, job)
    html = _client(operator).get(f"/jobs/{job.id}/").content.decode()
    assert 'data-state="dead"' in html
    assert f'action="/queues/{Q}/dlq/{entry}/replay/"' in html and 'data-action="discard"' in html
    assert "csrfmiddlewaretoken" in html and "abc123" not in html
    viewer_html = _client(viewer).get(f"/jobs/{job.id}/").content.decode()
    assert 'data-action="replay"' not in viewer_html and 'data-action="discard"' not in viewer_html


def test_a_dead_jobs_pages_show_the_traceback_its_error_group_keeps_once(viewer, redis):
    """An entry written as settle.lua writes it now (its traceback kept once per error group): the job page
    and the entry page show the traceback whole, with the job's own message in its last line."""
    [job_id] = build_dead(redis, Q, 1)
    [(entry, fields)] = redis.xrange(QueueKeys.for_queue(Q).dlq)
    assert b"Traceback" not in fields[b"j"]
    for url in (f"/jobs/{job_id}/", f"/queues/{Q}/dlq/{entry.decode()}/"):
        html = _client(viewer).get(url).content.decode()
        assert "Traceback (most recent call last)" in html, url
        assert "response = client.post(url, json=payload, timeout=5)" in html, url
        assert "httpx.ReadTimeout: upstream api-0.example.com did not answer in 0 ms\n</pre>" in html, url


def test_replaying_from_the_job_page_comes_back_to_it(operator, redis):
    job = dead_job()
    entry = add_dead(redis, Q, job)
    c = _client(operator)
    response = c.post(f"/queues/{Q}/dlq/{entry}/replay/", {"attempts": "reset", "when": "now",
                                                             "next": f"/jobs/{job.id}/"})
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.id}/"
    assert 'data-state="waiting"' in c.get(f"/jobs/{job.id}/").content.decode()


def test_a_delayed_jobs_page_offers_run_now_and_cancel(operator, redis):
    added = Queue(Q, redis_client=redis).add(TASK, [1, 2], delay=600_000)
    c = _client(operator)
    html = c.get(f"/jobs/{added.job_id}/").content.decode()
    assert 'data-state="delayed"' in html and 'data-action="run-now"' in html and 'data-action="cancel"' in html
    response = c.post(f"/queues/{Q}/delayed/run/", {"job_id": added.job_id, "next": f"/jobs/{added.job_id}/"})
    assert response["Location"] == f"/jobs/{added.job_id}/"
    assert 'data-state="waiting"' in c.get(f"/jobs/{added.job_id}/").content.decode()


def test_the_stream_list_pages_both_ways_and_links_to_jobs(viewer, redis):
    queue = Queue(Q, redis_client=redis)
    ids = [queue.add(TASK, [i, 0]).job_id for i in range(60)]
    c = _client(viewer)
    first = c.get(f"/queues/{Q}/stream/").content.decode()
    assert f'href="/jobs/{ids[-1]}/"' in first and f'href="/jobs/{ids[9]}/"' not in first
    assert "Older »" in first
    oldest = c.get(f"/queues/{Q}/stream/", {"order": "oldest"}).content.decode()
    assert f'href="/jobs/{ids[0]}/"' in oldest and f'href="/jobs/{ids[-1]}/"' not in oldest
    assert "is not a stream entry id from a previous page" in c.get(f"/queues/{Q}/stream/",
                                                                   {"cursor": "nope"}).content.decode()


def test_an_empty_stream_says_what_to_expect(viewer, redis):
    Queue(Q, redis_client=redis)
    html = _client(viewer).get(f"/queues/{Q}/stream/").content.decode()
    assert "No job is waiting" in html


def test_a_live_job_page_polls_its_progress_and_shows_it_masked(viewer, redis):
    from chasqui_core.engine.jobs import progress
    from chasqui_core.engine.store.keys import QueueKeys

    job = Queue(Q, redis_client=redis).add(TASK, [1, 2])
    redis.set(QueueKeys.for_queue(Q).progress + job.job_id,
              progress.encode(42.0, "copying rows, password=hunter2", 1_700_000_000_000))
    page = _client(viewer).get(f"/jobs/{job.job_id}/").content.decode()
    assert 'id="job-live"' in page and "hx-trigger" in page
    assert "42" in page and "copying rows" in page and "hunter2" not in page
    part = _client(viewer).get(f"/jobs/{job.job_id}/", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div id="job-live"') and "copying rows" in part
    assert "<html" not in part


def test_the_cancel_button_shows_only_to_those_who_may_cancel(viewer, operator, redis):
    job = Queue(Q, redis_client=redis).add(TASK, [1, 2])
    assert 'data-action="cancel-job"' not in _client(viewer).get(f"/jobs/{job.job_id}/").content.decode()
    assert 'data-action="cancel-job"' in _client(operator).get(f"/jobs/{job.job_id}/").content.decode()
    # a viewer who posts anyway is refused, and nothing is recorded
    assert _client(viewer).post(f"/jobs/{job.job_id}/cancel/").status_code == 403
    assert not redis.exists(f"{{chasqui:{Q}}}:cancel")
    response = _client(operator).post(f"/jobs/{job.job_id}/cancel/")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.job_id}/"
    assert redis.hexists(f"{{chasqui:{Q}}}:cancel", job.job_id)


def test_the_stream_list_shows_the_high_band_first_then_default_then_low_with_each_jobs_priority(viewer, redis):
    import re

    queue = Queue(Q, redis_client=redis)
    low = [queue.add(TASK, [i, 0], priority=-20).job_id for i in range(5)]
    default = [queue.add(TASK, [i, 0]).job_id for i in range(30)]
    high = [queue.add(TASK, ["<b>x</b>", i], priority=90).job_id for i in range(25)]
    c = _client(viewer)
    html = c.get(f"/queues/{Q}/stream/", {"order": "oldest"}).content.decode()
    rows = re.findall(r'data-band="(\w+)">.*?data-priority="(-?\d+)".*?href="/jobs/([^/]+)/"', html, re.S)
    assert rows == ([("high", "90", j) for j in high] + [("default", "0", j) for j in default[:25]])
    # paging crosses from one band into the next, and the cursor says which band it is in
    seen, cursors = [], []
    for _ in range(10):
        params = {"order": "newest", **({"cursor": cursors[-1]} if cursors else {})}
        page = c.get(f"/queues/{Q}/stream/", params).content.decode()
        seen += re.findall(r'href="/jobs/([^/]+)/"', page)
        found = re.search(r'rel="next" href="\?order=newest&amp;cursor=([^"]+)"', page)
        if not found:
            break
        cursors.append(unquote(found[1]))
    assert seen == [*reversed(high), *reversed(default), *reversed(low)]
    assert len(cursors) == 1 and cursors[0].count("-") == 1 and ":" not in cursors[0], "page 1 ends in the default band"


def test_a_jobs_page_shows_its_priority(viewer, redis):
    queue = Queue(Q, redis_client=redis)
    urgent = queue.add(TASK, [1, 2], delay=600, priority=40)
    plain = queue.add(TASK, [1, 2], delay=600)
    c = _client(viewer)
    html = c.get(f"/jobs/{urgent.job_id}/").content.decode()
    assert 'data-priority="40"' in html and "(high band)" in html
    assert 'data-priority="0"' in c.get(f"/jobs/{plain.job_id}/").content.decode()


def test_a_dead_jobs_page_shows_its_last_progress_as_history_and_no_pending_result(viewer, redis):
    from chasqui_core.engine.jobs import progress, results
    from chasqui_core.engine.store.keys import QueueKeys

    job = dead_job()
    add_dead(redis, Q, job)
    keys = QueueKeys.for_queue(Q)
    # what its life left: a progress report from its last run, and the result record written at enqueue
    redis.set(keys.progress + job.id, progress.encode(40.0, "charging card", 1_700_000_000_000))
    redis.set(keys.result + job.id, results.encode_result(job_id=job.id, task=job.task, status="READY", args=[],
                                                          kwargs={}, enqueued_at=1_700_000_000_000))
    c = _client(viewer)
    for html in (c.get(f"/jobs/{job.id}/").content.decode(),
                 c.get(f"/jobs/{job.id}/", HTTP_HX_REQUEST="true").content.decode()):
        assert 'data-live-state="dead"' in html and "hx-trigger" not in html  # not polled: nothing is under way
        assert "data-progress>" not in html and "progress-bar" not in html, "a stale report shown as current"
        assert "Last progress reported before it died" in html and "charging card" in html
    page = c.get(f"/jobs/{job.id}/").content.decode()
    assert "no return value yet" not in page
    assert "data-no-result>No return value: the job died (" in page


def test_cancelling_a_delayed_job_from_its_page_lands_on_its_page_which_follows_it_to_the_dlq(operator, redis,
                                                                                            redis_url):
    from chasqui_core.engine.jobs.registry import HandlerRegistry
    from tests.helpers import worker_running

    added = Queue(Q, redis_client=redis).add(TASK, [1, 2], delay=3_600_000)
    page = f"/jobs/{added.job_id}/"
    c = _client(operator)
    response = c.post(f"/jobs/{added.job_id}/cancel/", {"next": page})
    assert response.status_code == 302 and response["Location"] == page
    landed = c.get(page)
    html = landed.content.decode()
    assert landed.status_code == 200, "the page of the job just cancelled must not be a 404"
    assert "is cancelled: it will not run" in html and "data-cancel-requested" in html
    assert redis.zcard(QueueKeys.for_queue(Q).delayed) == 0  # it will not wait its hour
    ran = []
    registry = HandlerRegistry()
    registry.register(TASK, lambda a, b: ran.append((a, b)))
    with worker_running(redis_url, [Q], registry):  # the worker refuses it at pickup
        deadline = time.monotonic() + 30
        while 'data-state="dead"' not in (html := c.get(page).content.decode()) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert 'data-state="dead"' in html and "data-cancelled" in html, "the page says where the job went"
    assert ran == []


def test_the_queue_pages_cancel_of_a_delayed_job_still_removes_it_and_never_lands_on_a_404(operator, redis):
    added = Queue(Q, redis_client=redis).add(TASK, [1, 2], delay=3_600_000)
    c = _client(operator)
    # a form that names the job's page as where to come back (an old page's form): it would be a 404 now
    response = c.post(f"/queues/{Q}/delayed/cancel/", {"job_id": added.job_id, "next": f"/jobs/{added.job_id}/"})
    assert response.status_code == 302 and response["Location"] == f"/queues/{Q}/#delayed"
    assert "is cancelled: it will not run" in c.get(response["Location"]).content.decode()
    assert redis.zcard(QueueKeys.for_queue(Q).delayed) == 0


def test_an_unknown_id_is_answered_from_where_it_leads_with_a_way_to_search_everything(viewer, redis):
    queue = Queue(Q, redis_client=redis)
    for i in range(5000):
        queue.add(TASK, [i, 0])
    far = queue.add(TASK, [1, 2], job_id="order-9")  # a caller-given id: its marker names its entry
    redis.delete(QueueKeys.for_queue(Q).unique + "order-9")  # as a job added before markers named entries
    response = _client(viewer).get("/jobs/order-9/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "is not where its id leads" in html and "the rest of the stream of emails" in html
    assert 'href="?search=all"' in html
    found = _client(viewer).get("/jobs/order-9/", {"search": "all"})
    assert found.status_code == 200 and far.job_id in found.content.decode()
    kept = queue.add(TASK, [3, 4], job_id="order-10")
    found = _client(viewer).get("/jobs/order-10/")  # found at the entry its marker names
    assert found.status_code == 200 and kept.job_id in found.content.decode()
