"""Console pages and actions through Django's test client, against a real Redis."""

from __future__ import annotations

import re
from datetime import timedelta
from html import escape, unescape
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.test import Client

from chasqui_core.engine.dlq.fingerprint import fingerprint_id
from django.utils import timezone

from chasqui_core.engine.jobs.envelope import Job, decode, now_ms
from chasqui_core.engine.ops import metrics as metrics_mod
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.masking import MASK
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.services import background
from dashboard import readings as readings_mod
from dashboard import sampler as sampler_mod

from tests.api.helpers import heartbeat
from tests.helpers import add_dead, bulk_dead, dead_job

pytestmark = pytest.mark.django_db

Q = "emails"
KEYS = QueueKeys.for_queue(Q)
PAGES = ["/", f"/queues/{Q}/", f"/queues/{Q}/dlq/", f"/queues/{Q}/dlq/?view=groups", "/audit/",
         "/live/overview/", f"/live/queue/{Q}/", f"/live/dlq/{Q}/"]


def welcome_failure(**overrides) -> Job:
    """A welcome email the SMTP server kept refusing: the console's everyday dead job."""
    return dead_job(**{"task": "emails.tasks.send_welcome_email", "args": (1,), "messages": ("SMTP server said 451",),
                       "cls": "RuntimeError", **overrides})


def _client(user, **kwargs) -> Client:
    c = Client(**kwargs)
    c.force_login(user)
    return c


def _entries(html: str) -> list[str]:
    return re.findall(r'<tr data-entry="([^"]+)"', html)


# --- who may see what ---------------------------------------------------------------


@pytest.mark.parametrize("url", PAGES)
def test_anonymous_users_are_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_an_anonymous_poll_sends_the_whole_tab_to_login(client):
    response = client.get("/live/overview/", headers={"HX-Request": "true",
                                                      "HX-Current-URL": "http://testserver/queues/emails/"})
    assert response.status_code == 401
    assert response["HX-Redirect"] == "/login/?next=/queues/emails/"


@pytest.mark.parametrize("url", PAGES)
def test_users_without_the_view_permission_get_403(outsider, url):
    response = _client(outsider).get(url)
    assert response.status_code == 403
    assert b"chasqui_core.view_queues" in response.content


@pytest.mark.parametrize("url", PAGES)
def test_viewers_see_every_page(viewer, url):
    assert _client(viewer).get(url).status_code == 200


def test_unknown_queues_and_entries_are_404(viewer, redis):
    c = _client(viewer)
    assert c.get("/queues/nope/").status_code == 404
    assert c.get("/queues/nope/dlq/").status_code == 404
    assert c.get(f"/queues/{Q}/dlq/1-0/").status_code == 404
    assert c.get("/live/queue/nope/").status_code == 404
    assert c.get("/operations/00000000-0000-0000-0000-000000000000/").status_code == 404


ACTION_MARKERS = ['name="intent"', 'name="ids"', "Pause queue", "Resume queue", "Run now", ">Cancel<",
                  'data-action="replay"', 'data-action="discard"']


def _stock(redis) -> str:
    """A dead job and a delayed job in queue Q; returns the dead entry id."""
    entry = add_dead(redis, Q, welcome_failure())
    Queue(Q, redis_client=redis).add("emails.tasks.send_welcome_email", [7], delay=3600)
    return entry


def test_a_read_only_user_sees_no_action_buttons(viewer, redis):
    entry = _stock(redis)
    c = _client(viewer)
    for url in (f"/queues/{Q}/", f"/queues/{Q}/dlq/", f"/queues/{Q}/dlq/?view=groups", f"/queues/{Q}/dlq/{entry}/"):
        html = c.get(url).content.decode()
        assert "SMTP server said 451" in html or "send_welcome_email" in html
        for marker in ACTION_MARKERS:
            assert marker not in html, (url, marker)


def test_an_operator_sees_the_action_buttons(operator, redis):
    entry = _stock(redis)
    c = _client(operator)
    queue_page = c.get(f"/queues/{Q}/").content.decode()
    assert "Pause queue" in queue_page and "Run now" in queue_page and ">Cancel<" in queue_page
    dlq_page = c.get(f"/queues/{Q}/dlq/").content.decode()
    assert 'value="replay-selected"' in dlq_page and 'value="discard-matching"' in dlq_page
    assert f'name="ids" value="{entry}"' in dlq_page
    entry_page = c.get(f"/queues/{Q}/dlq/{entry}/").content.decode()
    assert 'data-action="replay"' in entry_page and 'data-action="discard"' in entry_page


def test_the_server_refuses_changes_to_a_read_only_user(viewer, redis):
    entry = _stock(redis)
    c = _client(viewer)
    [delayed] = redis.zrange(KEYS.delayed, 0, -1)
    job_id = decode(delayed).id
    posts = [
        (f"/queues/{Q}/pause/", {}),
        (f"/queues/{Q}/delayed/run/", {"job_id": job_id}),
        (f"/queues/{Q}/delayed/cancel/", {"job_id": job_id}),
        (f"/queues/{Q}/dlq/confirm/", {"intent": "replay-selected", "ids": [entry]}),
        (f"/queues/{Q}/dlq/replay/", {"scope": "selected", "ids": [entry], "attempts": "reset", "when": "now"}),
        (f"/queues/{Q}/dlq/discard/", {"scope": "matching"}),
        (f"/queues/{Q}/dlq/{entry}/replay/", {"attempts": "reset", "when": "now"}),
    ]
    for url, data in posts:
        assert c.post(url, data).status_code == 403, url
    assert redis.xlen(KEYS.dlq) == 1 and redis.zcard(KEYS.delayed) == 1 and not redis.exists(KEYS.paused)
    assert not AuditEntry.objects.exists()


def test_changes_are_posts_with_a_csrf_token(operator, redis):
    _stock(redis)
    c = _client(operator, enforce_csrf_checks=True)
    assert c.get(f"/queues/{Q}/pause/").status_code == 405
    assert c.post(f"/queues/{Q}/pause/").status_code == 403  # no token
    assert not redis.exists(KEYS.paused)
    page = c.get(f"/queues/{Q}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    assert c.post(f"/queues/{Q}/pause/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert redis.exists(KEYS.paused)


@pytest.fixture(autouse=True)
def _live_fragments_keep_the_tests_connection(monkeypatch):
    """The live figures come from ``/live/<topic>/`` here. The sampler closes old database connections after
    rendering (it runs outside requests); the test client keeps the test's transaction on one connection across
    requests, as it does by disconnecting that call from the request signals."""
    monkeypatch.setattr(sampler_mod, "close_old_connections", lambda: None)


# --- queues -------------------------------------------------------------------------------


def test_overview_lists_every_queue_with_its_figures(viewer, redis):
    for _i in range(3):
        add_dead(redis, "billing", welcome_failure(task="billing.tasks.charge", messages=("declined",)))
    Queue("billing", redis_client=redis).add("billing.tasks.charge", [1])
    html = _client(viewer).get("/live/overview/").content.decode()  # the figures arrive live, not on the page
    row = re.search(r'<tr id="queue-row-billing".*?</tr>', html, re.S)[0]
    assert re.search(r'data-col="dlq"><a [^>]*>3</a>', row)
    assert re.search(r'data-col="stream">1<', row)
    assert 'id="queue-row-emails"' in html  # configured queues show even when idle
    assert "Retries scheduled per second, last 5 minutes" in html


def test_the_queue_page_shows_each_worker_with_memory_and_running_jobs_and_lost_ones(viewer, redis):
    now = now_ms()
    heartbeat(redis, [Q], "w-busy", in_flight=1, rss_kb=150 * 1024,
              current=[("emails.tasks.send_welcome", "01JBUSYJOB000000000000000", now - 95_000)])
    heartbeat(redis, [Q], "w-gone", age_ms=300_000)
    html = _client(viewer).get(f"/live/queue/{Q}/").content.decode()
    busy = re.search(r'<tr class="">\s*<td[^>]*title="w-busy".*?</tr>\s*<tr class="current-jobs">.*?</tr>', html, re.S)
    assert busy, "the busy worker's row and its running jobs are missing"
    assert "150 MiB" in busy[0] and "emails.tasks.send_welcome" in busy[0]
    assert re.search(r"running for 1 m \d+ s", busy[0]), busy[0]
    gone = re.search(r'<tr class="stale">.*?</tr>', html, re.S)[0]
    assert 'title="w-gone"' in gone and ">lost</span>" in gone and re.search(r"lost 5 m( \d+ s)? ago", gone)


def test_pause_and_resume_are_audited_as_console_actions(operator, redis):
    c = _client(operator)
    response = c.post(f"/queues/{Q}/pause/", follow=True)
    assert redis.exists(KEYS.paused)
    assert "is paused" in response.content.decode() and "Resume queue" in response.content.decode()
    c.post(f"/queues/{Q}/resume/")
    assert not redis.exists(KEYS.paused)
    assert [(e.action, e.source, e.actor_repr) for e in AuditEntry.objects.order_by("id")] == [
        ("pause", "console", "olga"), ("resume", "console", "olga")]
    audit = c.get("/audit/?action=pause").content.decode()
    assert audit.count('<tr data-action="pause">') == 1 and 'data-action="resume"' not in audit


def test_delayed_jobs_run_now_or_cancel(operator, redis):
    queue = Queue(Q, redis_client=redis)
    soon = queue.add("emails.tasks.send_welcome_email", [1], delay=600)
    later = queue.add("emails.tasks.send_welcome_email", [2], delay=1200)
    c = _client(operator)
    page = c.get(f"/queues/{Q}/").content.decode()
    assert page.index(soon.job_id) < page.index(later.job_id)  # soonest first
    c.post(f"/queues/{Q}/delayed/run/", {"job_id": soon.job_id})
    assert [decode(f[b"j"]).id for _, f in redis.xrange(KEYS.stream)] == [soon.job_id]
    c.post(f"/queues/{Q}/delayed/cancel/", {"job_id": later.job_id})
    assert redis.zcard(KEYS.delayed) == 0
    gone = c.post(f"/queues/{Q}/delayed/cancel/", {"job_id": later.job_id}, follow=True).content.decode()
    assert "No delayed job" in gone
    assert [e.action for e in AuditEntry.objects.order_by("id")] == ["run_delayed_now", "cancel_delayed"]


# --- the DLQ browser ------------------------------------------------------------------------


def _mixed_dlq(redis) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {"timeout": [], "declined": [], "smtp": []}
    for i in range(4):
        timeout = welcome_failure(task="billing.charge", cls="TimeoutError",
                                  messages=(f"gateway timed out for order {i}",))
        declined = welcome_failure(task="billing.charge", cls="CardDeclined",
                                   messages=(f"card of customer {i} declined",))
        ids["timeout"].append(add_dead(redis, Q, timeout))
        ids["declined"].append(add_dead(redis, Q, declined))
    for _ in range(3):
        ids["smtp"].append(add_dead(redis, Q, welcome_failure(messages=("SMTP server said 451",))))
    return ids


def test_filters_live_in_the_url(viewer, redis):
    ids = _mixed_dlq(redis)
    c = _client(viewer)
    html = c.get(f"/queues/{Q}/dlq/?task=billing.charge&q=TIMED+OUT").content.decode()
    assert _entries(html) == ids["timeout"][::-1]  # newest first
    assert 'value="TIMED OUT"' in html and 'value="billing.charge"' in html
    html = c.get(f"/queues/{Q}/dlq/?error_class=CardDeclined").content.decode()
    assert sorted(_entries(html)) == sorted(ids["declined"])
    html = c.get(f"/queues/{Q}/dlq/?since=2000-01-01T00:00&until=2001-01-01T00:00").content.decode()
    assert _entries(html) == [] and "No dead letters match this filter" in html
    bad = c.get(f"/queues/{Q}/dlq/?since=2001-01-01T00:00&until=2000-01-01T00:00").content.decode()
    assert "the time range is empty" in bad


def test_replay_ticked_entries_after_a_confirmation_that_counts_them(operator, redis):
    ids = _mixed_dlq(redis)
    c = _client(operator)
    chosen = ids["smtp"][:2]
    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "replay-selected", "ids": chosen, "q": "451"})
    html = confirm.content.decode()
    assert confirm.status_code == 200 and "Replay 2 entries?" in html
    assert redis.xlen(KEYS.dlq) == 11  # nothing happens before confirming
    done = c.post(f"/queues/{Q}/dlq/replay/", {"scope": "selected", "ids": chosen, "q": "451",
                                               "attempts": "reset", "when": "now"})
    assert done.status_code == 302 and done["Location"] == f"/queues/{Q}/dlq/?q=451"
    assert redis.xlen(KEYS.dlq) == 9
    replayed = [decode(f[b"j"]) for _, f in redis.xrange(KEYS.stream)]
    assert len(replayed) == 2 and all(j.replays == 1 and j.attempt == 0 for j in replayed)
    [entry] = AuditEntry.objects.all()
    assert (entry.action, entry.source, entry.count, sorted(entry.target_ids)) == ("replay", "console", 2,
                                                                                  sorted(chosen))


def test_discard_everything_matching_states_how_many(operator, redis):
    ids = _mixed_dlq(redis)
    c = _client(operator)
    html = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "discard-matching", "q": "timed out"}).content.decode()
    assert "Discard 4 entries for good?" in html
    assert 'name="q" value="timed out"' in html and 'name="scope" value="matching"' in html
    c.post(f"/queues/{Q}/dlq/discard/", {"scope": "matching", "q": "timed out"})
    left = {e.decode() for e, _ in redis.xrange(KEYS.dlq)}
    assert left == set(ids["declined"] + ids["smtp"])
    assert AuditEntry.objects.get().filter == {"error_text": "timed out"}


def _group_links(html: str) -> list[str]:
    """The "Entries" link of each group row, in table order."""
    return [unescape(h) for h in re.findall(r'<a class="button small secondary" href="([^"]+)">Entries</a>', html)]


def _target(url: str) -> tuple[str, dict[str, str]]:
    """A link's path and its query parameters, whatever way they are encoded."""
    parts = urlsplit(url)
    return parts.path, dict(parse_qsl(parts.query))


def _chips(html: str) -> dict[str, str]:
    """Active filter chips on a DLQ page: the filter's name and the link that removes it."""
    return {key: unescape(href) for key, href in re.findall(
        r'<span class="chip" data-filter="([^"]+)"[^>]*>.*?<a class="chip-remove" href="([^"]+)"', html)}


def test_error_groups_with_actions_per_group(operator, redis):
    ids = _mixed_dlq(redis)
    c = _client(operator)
    html = c.get(f"/queues/{Q}/dlq/?view=groups").content.decode()
    rows = re.findall(r'<td class="r num strong">(\d+)</td>\s*<td class="error-cell">\s*'
                      r'<div class="mono fingerprint">([^<]+)<', html)
    assert [(int(n), fp) for n, fp in rows] == [
        (4, "CardDeclined: card of customer &lt;n&gt; declined"),
        (4, "TimeoutError: gateway timed out for order &lt;n&gt;"),
        (3, "RuntimeError: SMTP server said &lt;n&gt;"),
    ]
    fp = "TimeoutError: gateway timed out for order <n>"
    entries_link = _group_links(html)[1]
    assert _target(entries_link) == (f"/queues/{Q}/dlq/", {"fp": fingerprint_id(fp)})  # an id, never the text
    listed = c.get(entries_link).content.decode()
    assert _entries(listed) == ids["timeout"][::-1]
    assert _chips(listed) == {"fp": f"/queues/{Q}/dlq/"}
    assert f"error group:</span> {fingerprint_id(fp)}" in listed
    unfiltered = c.get(_chips(listed)["fp"]).content.decode()
    assert len(_entries(unfiltered)) == 11 and _chips(unfiltered) == {}

    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "replay-matching", "fp": fp}).content.decode()
    assert "Replay 4 entries?" in confirm and 'data-confirm-count="4"' in confirm
    assert 'name="scope" value="matching"' in confirm and "live progress bar" not in confirm
    assert f'name="fp" value="{escape(fp)}"' in confirm and 'name="ids"' not in confirm
    narrowed = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "discard-matching", "fp": fp, "q": "order 2"})
    assert "Discard 1 entry for good?" in narrowed.content.decode()
    assert redis.xlen(KEYS.dlq) == 11  # nothing happens before confirming

    done = c.post(f"/queues/{Q}/dlq/replay/", {"scope": "matching", "fp": fp, "attempts": "one", "when": "now"})
    assert done.status_code == 302 and _target(done["Location"]) == (f"/queues/{Q}/dlq/", {"fp": fp})
    assert {e.decode() for e, _ in redis.xrange(KEYS.dlq)} == set(ids["declined"] + ids["smtp"])
    jobs = [decode(f[b"j"]) for _, f in redis.xrange(KEYS.stream)]
    assert len(jobs) == 4 and all(j.max_attempts == j.attempt + 1 for j in jobs)  # exactly one more run
    [entry] = AuditEntry.objects.all()
    assert (entry.action, entry.count, entry.filter, entry.target_ids) == ("replay", 4, {"fingerprint": fp}, [])


def test_an_error_group_keeps_the_other_filters_and_each_chip_removes_one(operator, redis):
    ids = _mixed_dlq(redis)
    c = _client(operator)
    html = c.get(f"/queues/{Q}/dlq/", {"view": "groups", "task": "billing.charge"}).content.decode()
    assert len(_group_links(html)) == 2  # the SMTP group is another task
    fp = fingerprint_id("CardDeclined: card of customer <n> declined")
    assert f'<input type="hidden" name="fp" value="{fp}">' in html
    link = next(h for h in _group_links(html) if fp in h)
    assert _target(link) == (f"/queues/{Q}/dlq/", {"task": "billing.charge", "fp": fp})
    listed = c.get(link).content.decode()
    assert _entries(listed) == ids["declined"][::-1]
    chips = _chips(listed)
    assert {key: _target(url) for key, url in chips.items()} == {
        "task": (f"/queues/{Q}/dlq/", {"fp": fp}), "fp": (f"/queues/{Q}/dlq/", {"task": "billing.charge"})}
    assert _entries(c.get(chips["task"]).content.decode()) == ids["declined"][::-1]
    without_group = c.get(chips["fp"]).content.decode()
    assert sorted(_entries(without_group)) == sorted(ids["declined"] + ids["timeout"])
    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "discard-matching", "task": "billing.charge",
                                                   "fp": fp}).content.decode()
    assert "Discard 4 entries for good?" in confirm
    c.post(f"/queues/{Q}/dlq/discard/", {"scope": "matching", "task": "billing.charge", "fp": fp})
    assert {e.decode() for e, _ in redis.xrange(KEYS.dlq)} == set(ids["timeout"] + ids["smtp"])
    assert AuditEntry.objects.get().filter == {"task": "billing.charge", "fingerprint": fp}
    none_left = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "discard-matching", "fp": fp}).content.decode()
    assert "Nothing matches any more" in none_left


@pytest.mark.django_db(transaction=True)
def test_a_big_error_group_runs_in_the_background(operator, redis, settings):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 10}
    group = [add_dead(redis, Q, welcome_failure(cls="TimeoutError", messages=(f"order {i} timed out",)))
             for i in range(30)]
    others = [add_dead(redis, Q, welcome_failure(cls="TimeoutError", messages=(f"order {i} refused",)))
              for i in range(15)]
    fp = fingerprint_id("TimeoutError: order <n> timed out")
    c = _client(operator)
    html = c.get(f"/queues/{Q}/dlq/?view=groups").content.decode()
    assert f'<input type="hidden" name="fp" value="{fp}">' in html
    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "replay-matching", "fp": fp}).content.decode()
    assert "Replay 30 entries?" in confirm and "live progress bar" in confirm
    response = c.post(f"/queues/{Q}/dlq/replay/", {"scope": "matching", "fp": fp, "attempts": "reset",
                                                   "when": "now"})
    op = Operation.objects.get()
    assert response["Location"] == f"/operations/{op.pk}/"
    assert (op.kind, op.filter, op.total) == ("replay", {"fingerprint": fp}, 30)
    assert [o.pk for o in background.run_pending(Q)] == [op.pk]  # what a worker of Q does
    page = c.get(f"/operations/{op.pk}/").content.decode()
    assert 'data-status="done"' in page and f"error group:</span> {fp}" in page
    assert re.search(r"<strong data-done>30</strong> of <strong data-total>30</strong>", page)
    assert {e.decode() for e, _ in redis.xrange(KEYS.dlq)} == set(others)
    assert redis.xlen(KEYS.stream) == 30 and len(group) == 30


@pytest.mark.django_db(transaction=True)
def test_a_big_operation_runs_in_the_background_with_progress(operator, redis, settings):
    settings.CHASQUI = {**settings.CHASQUI, "BACKGROUND_THRESHOLD": 10}
    for i in range(60):
        add_dead(redis, Q, welcome_failure(messages=(f"boom {i}",)))
    c = _client(operator)
    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "replay-matching"}).content.decode()
    assert "Replay 60 entries?" in confirm and "live progress bar" in confirm
    response = c.post(f"/queues/{Q}/dlq/replay/", {"scope": "matching", "attempts": "reset", "when": "now"})
    op = Operation.objects.get()
    assert response["Location"] == f"/operations/{op.pk}/"
    assert [o.pk for o in background.run_pending(Q)] == [op.pk]  # what a worker of Q does
    page = c.get(f"/operations/{op.pk}/").content.decode()
    assert 'data-status="done"' in page and 'aria-valuenow="100"' in page
    assert re.search(r"<strong data-done>60</strong> of <strong data-total>60</strong>", page)
    fragment = c.get(f"/live/operation/{op.pk}/").content.decode()
    assert 'id="op-progress"' in fragment and 'hx-swap-oob="true"' in fragment
    assert redis.xlen(KEYS.dlq) == 0 and redis.xlen(KEYS.stream) == 60
    late = c.post(f"/operations/{op.pk}/cancel/", follow=True).content.decode()
    assert "already finished" in late


def test_the_entry_page_shows_masked_arguments_every_run_and_lineage(viewer, redis):
    job = welcome_failure(
        kwargs={"email": "ana@example.com", "password": "hunter2", "headers": {"Authorization": "Bearer abc.def.ghi"}},
        messages=("timeout talking to smtp://mailer:s3cr3t@mx.example.com", "connection reset", "451 later"),
        replays=2)
    entry = add_dead(redis, Q, job)
    html = _client(viewer).get(f"/queues/{Q}/dlq/{entry}/").content.decode()
    for secret in ("hunter2", "s3cr3t", "abc.def.ghi"):
        assert secret not in html
    assert MASK in html and "ana@example.com" in html
    for message in ("connection reset", "451 later"):
        assert message in html
    assert html.count('class="run"') == 3
    assert html.count("Traceback (most recent call last)") == 3
    assert "host-1:4242:abcd" in html and "took 20 ms" in html
    assert "replayed 2 times" in html and job.id in html


def test_replay_one_entry_with_one_more_attempt_at_a_time(operator, redis):
    entry = add_dead(redis, Q, welcome_failure(messages=("a", "b")))
    when = (timezone.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    response = _client(operator).post(f"/queues/{Q}/dlq/{entry}/replay/", {
        "attempts": "one", "when": "at", "run_at": when.strftime("%Y-%m-%dT%H:%M")})
    assert response.status_code == 302
    [(member, score)] = redis.zrange(KEYS.delayed, 0, -1, withscores=True)
    job = decode(member)
    assert score == when.timestamp() * 1000
    assert (job.attempt, job.max_attempts, job.replays) == (2, 3, 1)


def test_a_replay_at_a_time_needs_the_time(operator, redis):
    entry = add_dead(redis, Q, welcome_failure())
    page = _client(operator).post(f"/queues/{Q}/dlq/{entry}/replay/", {"attempts": "reset", "when": "at"},
                                  follow=True).content.decode()
    assert "Give the date and time" in page and redis.xlen(KEYS.dlq) == 1


def test_job_data_is_escaped_everywhere(operator, redis):
    evil = "<script>alert('x')</script>"
    job = welcome_failure(task=f"tasks.{evil}", args=[evil, {"note": evil}], cls="ValueError",
                          messages=(f"bad input {evil}",))
    entry = add_dead(redis, Q, job)
    c = _client(operator)
    for url in (f"/queues/{Q}/dlq/", f"/queues/{Q}/dlq/?view=groups", f"/queues/{Q}/dlq/{entry}/",
                f"/queues/{Q}/dlq/?q={evil}"):
        html = c.get(url).content.decode()
        assert "<script>alert" not in html, url
        assert "&lt;script&gt;alert(" in html, url
    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "discard-matching", "q": evil}).content.decode()
    assert "<script>alert" not in confirm and "Discard 1 entry for good?" in confirm


# --- paging through a big DLQ ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_pages_of_a_dlq_with_200000_entries(viewer, redis):
    ids = bulk_dead(redis, Q, 200_000)
    newest_first = ids[::-1]
    c = _client(viewer)
    first = c.get(f"/queues/{Q}/dlq/").content.decode()
    page1 = _entries(first)
    assert page1 == newest_first[:50]
    assert "200,000" in c.get(f"/live/dlq/{Q}/").content.decode()
    cursor = re.search(r'href="\?cursor=([^"]+)" rel="next"', first)[1]
    second = c.get(f"/queues/{Q}/dlq/?cursor={cursor}").content.decode()
    page2 = _entries(second)
    assert page2 == newest_first[50:100]
    assert not set(page1) & set(page2)
    filtered = c.get(f"/queues/{Q}/dlq/?q=row+199990+failed").content.decode()
    assert _entries(filtered) == [ids[199_990]]
    # How fast a page opens at this size is a goal of the dlq-page benchmark (bench/dlq_page.py), not of a test.


# --- live figures on the pages ------------------------------------------------------------------


LIVE_PARTS = {"/": ("ov-cards", "ov-queues", "ov-charts"), f"/queues/{Q}/": ("q-cards", "q-charts", "q-workers"),
              f"/queues/{Q}/dlq/": ("dlq-live",)}
"""Each page with live figures, and the ids of the parts its first live fragment fills."""


def test_pages_render_without_reading_the_counter_history_and_the_live_fragment_fills_them(viewer, redis,
                                                                                          monkeypatch):
    add_dead(redis, Q, welcome_failure())
    c = _client(viewer)

    def refuse(*args, **kwargs):
        raise AssertionError("a page read the counter history on its request path")

    with monkeypatch.context() as m:
        m.setattr(metrics_mod, "multi_series", refuse)
        m.setattr(readings_mod.Reader, "read", refuse)
        pages = {path: c.get(path) for path in LIVE_PARTS}
    topics = {"/": "overview", f"/queues/{Q}/": f"queue/{Q}", f"/queues/{Q}/dlq/": f"dlq/{Q}"}
    for path, ids in LIVE_PARTS.items():
        assert pages[path].status_code == 200, path
        html = pages[path].content.decode()
        live = c.get(f"/live/{topics[path]}/").content.decode()
        for part in ids:
            assert re.search(rf'<div class="live-pending" id="{part}" data-live-pending', html), (path, part)
            assert re.search(rf'id="{part}" hx-swap-oob="true"', live), (path, part)
        assert "data-live-pending" not in live
    assert re.search(r'data-metric="dlq">1<', c.get(f"/live/dlq/{Q}/").content.decode())


def _server_second(redis) -> int:
    seconds, _ = redis.time()
    return int(seconds)


def test_a_retry_spike_is_flagged_on_the_overview_and_the_queue(viewer, redis):
    Queue("billing", redis_client=redis).add("billing.tasks.charge", [1])
    seconds = QueueKeys.for_queue("billing").second_counters
    now = _server_second(redis)
    for back in range(1, 200):
        redis.hincrby(f"{seconds}{now - back}", "retried", 40 if back <= 12 else (1 if back % 10 == 0 else 0))
    c = _client(viewer)
    overview = c.get("/live/overview/").content.decode()
    row = re.search(r'<tr id="queue-row-billing".*?</tr>', overview, re.S)[0]
    assert "badge-spike" in row
    assert "Spike: " in overview and "retries/s over the last 10 s" in overview
    assert 'class="area spike"' in overview
    calm = re.search(r'<tr id="queue-row-emails".*?</tr>', overview, re.S)[0]
    assert "badge-spike" not in calm
    queue_page = c.get("/live/queue/billing/").content.decode()
    assert "retry spike" in queue_page


def test_without_redis_the_console_says_so(viewer, settings):
    settings.CHASQUI = {"REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens on port 1
    response = _client(viewer).get("/")
    assert response.status_code == 503
    assert b"Redis is unreachable" in response.content


def test_secrets_never_reach_the_console_nor_its_urls(viewer, redis):
    job = dead_job(kwargs={"pwd": "pw-LEAK-1", "private_key": "pk-LEAK-2", "session_id": "sid-LEAK-3",
                           "Cookie": "ck-LEAK-4", "email": "a@b.c"},
                   args=("x", {"api_key": "ak-LEAK-5"}), messages=("login refused: password=x9TopSecret",))
    eid = add_dead(redis, Q, job)
    c = _client(viewer)
    pages = [c.get(f"/queues/{Q}/dlq/?view=groups").content.decode(), c.get(f"/queues/{Q}/dlq/").content.decode(),
             c.get(f"/queues/{Q}/dlq/{eid}/").content.decode()]
    for html in pages:
        for leak in ("LEAK", "TopSecret"):
            assert leak not in html
    assert "a@b.c" in pages[2]  # ordinary values still show
    for link in _group_links(pages[0]):
        assert "TopSecret" not in link and "password" not in unescape(link)


@pytest.mark.django_db(transaction=True)
def test_a_paced_replay_of_a_big_set_is_confirmed_at_once_and_waits_for_a_worker(operator, redis):
    bulk_dead(redis, Q, 12_000, cls="ValueError")
    bulk_dead(redis, Q, 500, cls="KeyError")
    c = _client(operator)
    confirm = c.post(f"/queues/{Q}/dlq/confirm/", {"intent": "replay-matching", "error_class": "ValueError"})
    html = confirm.content.decode()
    assert "Replay about " in html and "estimated from samples" in html and 'name="rate"' in html
    response = c.post(f"/queues/{Q}/dlq/replay/", {"scope": "matching", "error_class": "ValueError",
                                                   "attempts": "reset", "when": "now", "rate": "5000"})
    op = Operation.objects.get()
    assert response["Location"] == f"/operations/{op.pk}/"
    assert op.options["rate"] == 5000 and op.status == "pending"
    page = c.get(f"/operations/{op.pk}/").content.decode()
    assert "data-waiting-for-worker" in page and "runworker emails" in page
    assert "paced at 5,000 jobs a second" in page and "of about" in page
    assert redis.xlen(KEYS.dlq) == 12_500  # nothing moves until a worker (or the shell) runs it
    [done] = background.run_pending(Q)
    assert (done.status, done.count, done.total) == ("done", 12_000, 12_000)
    page = c.get(f"/operations/{op.pk}/").content.decode()
    assert "data-waiting-for-worker" not in page and "of about" not in page
    assert AuditEntry.objects.get(action="replay").detail["rate"] == 5000


def test_search_fills_its_list_chunk_by_chunk_escaped_and_masked(viewer, redis):
    bulk_dead(redis, Q, 2000)
    hit = add_dead(redis, Q, dead_job(kwargs={"note": "ticket ZX-41", "api_key": "ZX-41-secret"},
                                      messages=("<script>alert('ZX-41')</script>",)))
    c = _client(viewer)
    page = c.get(f"/queues/{Q}/dlq/search/", {"q": "zx-41"}).content.decode()
    assert 'id="search-next"' in page and "/dlq/search/more/?q=zx-41" in page and "data-search-stop" in page
    more = c.get(f"/queues/{Q}/dlq/search/more/", {"q": "zx-41"}).content.decode()
    assert f'data-entry="{hit}"' in more and "<script>alert" not in more and "&lt;script&gt;" in more
    assert 'hx-swap-oob="true"' in more and "<strong data-found>1</strong>" in more
    assert 'id="search-next"' not in more and "data-search-stop" not in more  # the whole DLQ was read
    hidden = c.get(f"/queues/{Q}/dlq/search/more/", {"q": "secret"}).content.decode()
    assert "data-no-match" in hidden and "data-entry" not in hidden
    bad = c.get(f"/queues/{Q}/dlq/search/more/", {"q": "  "}).content.decode()
    assert "Type some text" in bad
    assert c.get("/queues/bad name/dlq/search/").status_code == 404


# --- priority bands ------------------------------------------------------------------------------


def test_the_queue_page_shows_each_priority_bands_waiting_jobs(viewer, redis):
    queue = Queue(Q, redis_client=redis)
    for priority, n in ((5, 3), (0, 4), (-5, 2)):
        for i in range(n):
            queue.add("emails.tasks.send", [i], priority=priority)
    c = _client(viewer)
    Queue("billing", redis_client=redis).add("billing.tasks.charge", [1])
    assert 'data-metric="bands"' not in c.get("/live/queue/billing/").content.decode(), "no bands, no breakdown"
    html = c.get(f"/live/queue/{Q}/").content.decode()
    assert re.search(r'data-metric="stream">9<', html)
    bands = re.search(r'data-metric="bands">(.*?)</div>', html, re.S)
    assert bands
    assert re.sub(r"<[^>]+>", "", bands[1]) == "waiting: 9 (high 3, default 4, low 2)"


def test_the_purge_confirmation_counts_every_band(operator, redis):
    queue = Queue(Q, redis_client=redis)
    for priority in (1, 1, 0, -1):
        queue.add("emails.tasks.send", [1], priority=priority)
    c = _client(operator)
    html = c.post(f"/queues/{Q}/purge/confirm/").content.decode()
    assert 'data-confirm-count="4"' in html
    assert re.sub(r"<[^>]+>", "", re.search(r"<p data-confirm-bands>(.*?)</p>", html, re.S)[1]) == \
        "By priority: high 2, default 1, low 1."
    c.post(f"/queues/{Q}/purge/")
    assert [redis.xlen(KEYS.in_band(b).stream) for b in ("high", "", "low")] == [0, 0, 0]
    [entry] = AuditEntry.objects.filter(action="purge")
    assert entry.count == 4


def test_the_figures_show_runs_lost_jobs_recovered_and_dead_letters_per_reason(viewer, redis):
    Queue("billing", redis_client=redis).add("billing.tasks.charge", [1])
    # what reclaim.lua and settle.lua leave after workers died under their runs
    redis.hset(QueueKeys.for_queue("billing").totals, mapping={"lost": 3, "recovered": 12, "fetched": 1500,
                                                               "dlq": 4, "dlq:panic": 1, "dlq:retries_exhausted": 3})
    redis.hset(QueueKeys.for_queue(Q).totals, mapping={"lost": 2, "dlq": 2, "dlq:panic": 2})
    html = _client(viewer).get("/live/queue/billing/").content.decode()
    cards = re.search(r'<section class="cards" id="q-cards".*?</section>', html, re.S)[0]
    assert re.search(r'data-metric="lost">3<', cards)
    assert re.search(r'data-metric="recovered">12<', cards) and re.search(r'data-metric="fetched">1,500<', cards)
    assert re.search(r'data-metric="dlq-total">4<', cards)
    assert re.search(r'<span data-reason="panic">panic 1</span>, <span data-reason="retries_exhausted">'
                     r'retries_exhausted 3</span>', cards)
    overview = _client(viewer).get("/live/overview/").content.decode()
    total = re.search(r'<section class="cards" id="ov-cards".*?</section>', overview, re.S)[0]
    assert re.search(r'data-metric="lost">5<', total), "every queue's, added up"
    assert re.search(r'<span data-reason="panic">panic 3</span>', total)
