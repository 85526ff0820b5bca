"""Operator pages in a real browser (headless Chromium via Playwright), against Daphne and a real worker:
the Workers page's quiet and stop, a queue's purge with its confirmation, and a first failure reaching the
overview's Failed/s card between two ticks of a slow sampler."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chasqui_core.engine.ops import stats
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from dashboard.screenshots import CHROMIUM, launch, log_in, serve, wait_live
from tests.dashboard.e2e_app import GATEWAY_DOWN, QUEUE
from tests.helpers import subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]
KEYS = QueueKeys.for_queue(QUEUE)
CHARGE = "tests.dashboard.e2e_app.tasks.charge"
RENDER = "tests.dashboard.e2e_app.tasks.render_invoice"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture(scope="module", autouse=True)
def _chromium():
    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing")
        pytest.skip(f"{CHROMIUM} is missing")


@pytest.fixture
def env(redis_url, operator, viewer):
    return {
        **os.environ,
        "REDIS_URL": redis_url,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.dashboard.e2e_live_settings",
        "PYTHONPATH": str(ROOT),
        "DEBUG": "1",
    }


@pytest.fixture
def start_worker(env, tmp_path):
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        log = open(tmp_path / f"worker-{len(started)}.log", "w")  # noqa: SIM115 - the worker writes it
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", QUEUE, "--concurrency", "4"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            if proc.poll() is None:
                proc.kill()


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_workers_page_quiets_then_stops_a_worker(env, start_worker, redis, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    proc = start_worker()
    [worker] = _wait(lambda: stats.workers(redis, QUEUE), 30, "the worker's heartbeat")
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.on("dialog", lambda dialog: dialog.accept())
            log_in(page, base, "olga", "olga-password", next_path="/workers/")
            row = page.locator(f'tr[data-worker="{worker.id}"]')
            expect(row.locator("[data-state]")).to_have_text("running")

            row.locator("button[data-action=quiet]").click()
            expect(page.locator(".messages")).to_contain_text("is asked to quiet down")
            # the worker hears it within a second or two and says so in its heartbeat; the table refreshes itself
            expect(row.locator("[data-state]")).to_have_text("quiet", timeout=15_000)
            expect(row.locator("button[data-action=quiet]")).to_have_count(0)
            job = Queue(QUEUE, redis_client=redis).add(RENDER, [1])
            time.sleep(2.5)
            assert redis.xlen(KEYS.stream) == 1 and redis.xpending(KEYS.stream, "chasqui")["pending"] == 0, (
                "a quiet worker took a job"
            )

            row.locator(f'a[href="/workers/{worker.id}/"]').click()
            expect(page.locator("#running")).to_contain_text("this quiet worker has finished its jobs")
            page.locator("button[data-action=stop]").click()
            expect(page.locator(".messages")).to_contain_text("is asked to stop")
            assert proc.wait(20) == 0
            expect(page.locator(f'tr[data-worker="{worker.id}"]')).to_have_count(0, timeout=10_000)
            expect(page.locator("#worker-list")).to_contain_text("No worker has a heartbeat")

            viewer = browser.new_context().new_page()
            start_worker()
            _wait(lambda: stats.workers(redis, QUEUE), 30, "the new worker's heartbeat")
            log_in(viewer, base, "vera", "vera-password", next_path="/workers/")
            expect(viewer.locator("tr[data-worker] [data-state]")).to_have_text("running")
            expect(viewer.locator("main form[method=post]")).to_have_count(0)
            _wait(lambda: redis.xlen(KEYS.dlq) == 1, 20, "the job the quiet worker left to run elsewhere")
            assert job.job_id
        finally:
            browser.close()
    from chasqui_core.models import AuditEntry

    assert list(AuditEntry.objects.order_by("id").values_list("action", "actor_repr", "source")) == [
        ("worker_quiet", "olga", "console"),
        ("worker_stop", "olga", "console"),
    ]


def test_purging_a_queue_asks_first_with_the_count(env, redis, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    queue = Queue(QUEUE, redis_client=redis)
    for n in range(7):
        queue.add(CHARGE, [n])
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            log_in(page, base, "olga", "olga-password", next_path=f"/queues/{QUEUE}/")
            page.locator("button[data-action=purge]").click()
            expect(page.locator("h1")).to_have_text(f"Delete 7 waiting jobs from {QUEUE}?")
            assert redis.xlen(KEYS.stream) == 7, "asking deletes nothing"
            page.locator("a.button", has_text="Cancel").click()
            expect(page).to_have_url(f"{base}/queues/{QUEUE}/")
            assert redis.xlen(KEYS.stream) == 7

            page.locator("button[data-action=purge]").click()
            page.locator("button[data-confirm-button]").click()
            expect(page.locator(".messages")).to_contain_text(f"Deleted 7 waiting jobs from {QUEUE}")
            assert redis.xlen(KEYS.stream) == 0
        finally:
            browser.close()


def test_a_queue_with_priorities_shows_each_bands_waiting_jobs_live_and_purges_every_band(env, redis, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    queue = Queue(QUEUE, redis_client=redis)
    for n in range(3):
        queue.add(CHARGE, [n])
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            log_in(page, base, "olga", "olga-password", next_path=f"/queues/{QUEUE}/")
            expect(page.locator("[data-metric=bands]")).to_have_count(0)  # no prioritised job yet
            for n in range(2):
                queue.add(CHARGE, [100 + n], priority=10)
            queue.add(CHARGE, [200], priority=-10)
            page.reload()
            expect(page.locator("[data-metric=bands]")).to_have_text("waiting: 6 (high 2, default 3, low 1)")

            page.goto(f"{base}/queues/{QUEUE}/stream/?order=oldest")
            expect(page.locator("tr[data-band] td[data-priority]")).to_have_text(
                ["10", "10", "0", "0", "0", "-10"])

            page.goto(f"{base}/queues/{QUEUE}/")
            page.locator("button[data-action=purge]").click()
            expect(page.locator("h1")).to_have_text(f"Delete 6 waiting jobs from {QUEUE}?")
            expect(page.locator("[data-confirm-bands]")).to_have_text("By priority: high 2, default 3, low 1.")
            page.locator("button[data-confirm-button]").click()
            expect(page.locator(".messages")).to_contain_text(f"Deleted 6 waiting jobs from {QUEUE}")
            assert [redis.xlen(KEYS.in_band(b).stream) for b in ("high", "", "low")] == [0, 0, 0]
        finally:
            browser.close()


def test_a_first_failure_shows_on_the_overview_without_waiting_for_the_next_tick(env, start_worker, redis, tmp_path):
    from playwright.sync_api import sync_playwright

    queue = Queue(QUEUE, redis_client=redis)
    queue.add(CHARGE, [0], delay=3_600_000)  # registers the queue; never runs during the test
    start_worker()
    _wait(lambda: stats.workers(redis, QUEUE), 30, "the worker's heartbeat")
    redis.set(GATEWAY_DOWN, "1")
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            log_in(page, base, "vera", "vera-password")
            wait_live(page)
            card = page.locator("#ov-cards [data-metric=failed-rate]")
            assert card.inner_text().startswith("0.0")
            page.wait_for_timeout(1500)  # the watch has seen the counters with nothing failing
            started = time.monotonic()
            queue.add(RENDER, [1])  # always fails, no retry
            page.wait_for_function(
                "() => !document.querySelector('#ov-cards [data-metric=failed-rate]').textContent.startsWith('0.0')",
                timeout=10_000,
                polling=20,
            )
            took = time.monotonic() - started
            # Ticks are 5 s apart here (e2e_live_settings): only the failure watch brings it sooner. The goal at
            # the default 1 s interval is under a second (bench/console_live.py measures it); a shared test
            # machine gets a generous bound.
            assert took < 2.5, f"the first failure took {took:.2f} s to reach the card"
        finally:
            browser.close()


def test_the_history_range_picker_switches_in_place_from_the_keyboard(env, redis, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from chasqui_core.engine.ops import totals

    Queue(QUEUE, redis_client=redis).add(CHARGE, [1])
    flat = totals.duration_increments([CHARGE] * 4, [40, 40, 40, 900], [CHARGE])
    for field, amount in zip(flat[::2], flat[1::2], strict=True):
        redis.hincrby(KEYS.durations, field, amount)
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            log_in(page, base, "vera", "vera-password", next_path=f"/queues/{QUEUE}/")
            panel = page.locator("#history")
            expect(panel.locator("a[aria-current=page]")).to_have_text("1 hour")
            expect(panel.locator(".chart-title")).to_have_text("Failed runs per minute, last 1 hour")
            expect(panel.locator(f'tr[data-task="{CHARGE}"] [data-col=failures]')).to_have_text("1")
            page.evaluate("window.__sameDocument = true")

            panel.locator("a[data-range='24h']").focus()
            page.keyboard.press("Enter")
            expect(page.locator("#history a[aria-current=page]")).to_have_text("24 hours")
            expect(page.locator("#history .chart-title")).to_have_text("Failed runs per 15 minutes, last 24 hours")
            page.locator("#history a[data-range='7d']").click()
            expect(page.locator("#history .chart-title")).to_have_text("Failed runs per hour, last 7 days")
            expect(page.locator(f'#history tr[data-task="{CHARGE}"] [data-col=runs]')).to_have_text("4")
            assert page.evaluate("window.__sameDocument") is True, "the panel was swapped, the page not reloaded"
        finally:
            browser.close()


def test_the_figures_arrive_on_pages_whose_first_paint_has_placeholders(env, redis, tmp_path):
    """The pages do not read the live figures on the request; the socket's first message fills them in place."""
    from playwright.sync_api import expect, sync_playwright

    queue = Queue(QUEUE, redis_client=redis)
    for n in range(4):
        queue.add(CHARGE, [n])
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            log_in(page, base, "vera", "vera-password", next_path="/")
            for path, figure, value in (("/", f"#queue-row-{QUEUE} [data-col=stream]", "4"),
                                        (f"/queues/{QUEUE}/", "#q-cards [data-metric=stream]", "4"),
                                        (f"/queues/{QUEUE}/dlq/", "#dlq-live [data-metric=dlq]", "0")):
                response = page.goto(f"{base}{path}")
                assert b"data-live-pending" in response.body(), f"{path}: the figures were drawn on the request"
                expect(page.locator(figure)).to_have_text(value, timeout=15_000)
                expect(page.locator("[data-live-pending]")).to_have_count(0)
                expect(page.locator("#live-pill")).to_have_text("Live")
        finally:
            browser.close()


def test_the_workers_table_fits_1400_pixels_with_a_long_worker_id(env, redis, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from tests.api.helpers import heartbeat

    long_id = "ip-172-31-44-120.eu-west-1.compute.internal:48213:9f2c1a"
    heartbeat(redis, [QUEUE, "emails", "webhooks"], long_id, in_flight=12, processed=1_234_567)
    heartbeat(redis, [QUEUE], "web-1:4100:0000")
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            log_in(page, base, "olga", "olga-password", next_path="/workers/")
            expect(page.locator("tr[data-worker]")).to_have_count(2)
            page.screenshot(path=str(tmp_path / "workers-1400.png"))
            fit = page.evaluate("""() => {
              const wrap = document.querySelector('#worker-list .table-wrap') || document.querySelector('.table-wrap');
              const box = wrap.getBoundingClientRect();
              const out = {scrolls: wrap.scrollWidth > wrap.clientWidth, cut: [], ids: []};
              for (const row of document.querySelectorAll('tr[data-worker]')) {
                for (const b of row.querySelectorAll('button')) {
                  const r = b.getBoundingClientRect(), td = b.closest('td').getBoundingClientRect();
                  if (r.right > box.right + 0.5 || r.right > td.right + 0.5) out.cut.push(b.textContent.trim());
                }
                const id = row.querySelector('[data-worker-id]');
                const a = id.querySelector('a');
                out.ids.push([a.textContent, a.getBoundingClientRect().right <= id.getBoundingClientRect().right + 0.5,
                              id.scrollWidth <= id.clientWidth]);
              }
              return out;
            }""")
            assert not fit["scrolls"], "the table is wider than its box"
            assert fit["cut"] == [], f"buttons cut off: {fit['cut']}"
            assert len(fit["ids"]) == 2 and all(shown and whole for _, shown, whole in fit["ids"]), fit["ids"]
            assert {text for text, _, _ in fit["ids"]} == {long_id, "web-1:4100:0000"}
            expect(page.locator("button[data-action=stop]")).to_have_count(2)
        finally:
            browser.close()
