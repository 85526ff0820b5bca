"""Console pages and actions through Django's test client, against a real Redis."""

from __future__ import annotations

import re
from html import unescape

import pytest

from chasqui_core.engine.jobs.envelope import decode, now_ms
from chasqui_core.engine.ops import metrics as metrics_mod
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.models import AuditEntry, Operation
from chasqui_core.services import background
from dashboard import readings as readings_mod

from tests.api.helpers import heartbeat
from tests.helpers import add_dead, bulk_dead, dead_job
from tests.dashboard.pages import _live_fragments_keep_the_tests_connection  # noqa: F401 - autouse fixture
from tests.dashboard.pages import KEYS, PAGES, Q, _client, _group_links, welcome_failure


pytestmark = pytest.mark.django_db


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
