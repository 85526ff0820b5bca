"""The console in a real browser: headless Chromium (Debian's) driven by Playwright,
against Daphne and a worker started as subprocesses on the test database and Redis.

One scenario, the 3 a.m. one: a payment gateway is down, retries climb, jobs
die; the operator watches it live, finds the dead jobs by their error text,
replays them once the gateway is back, sees the DLQ drain and the jobs
complete, and discards the dead letters that cannot be saved. A read-only
colleague sees the same pages without a single action button.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from dashboard.screenshots import CHROMIUM, launch, log_in, serve, wait_live
from tests.dashboard.e2e_app import GATEWAY_DOWN, QUEUE
from tests.helpers import subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]
KEYS = QueueKeys.for_queue(QUEUE)
CHARGE = "tests.dashboard.e2e_app.tasks.charge"
RENDER = "tests.dashboard.e2e_app.tasks.render_invoice"

REFUSED_WEBSOCKETS = """
window.WebSocket = class {
  constructor(url) {
    this.url = url; this.readyState = 3;
    setTimeout(() => {
      if (this.onerror) this.onerror(new Event("error"));
      if (this.onclose) this.onclose(new CloseEvent("close", {code: 1006}));
    }, 20);
  }
  send() {}
  close() {}
  addEventListener() {}
};
"""
"""Stands in for a network that refuses every websocket (the page must fall back to polling)."""

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture(scope="module", autouse=True)
def _chromium():
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: `make test` installs it when run as root (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must run the browser tests
        pytest.skip(message)


@pytest.fixture
def stack(redis, redis_url, operator, viewer, tmp_path):
    """Daphne and a worker for QUEUE, both on the e2e settings, the test database and Redis."""
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": subprocess_database_url(),
           "DJANGO_SETTINGS_MODULE": "tests.dashboard.e2e_settings", "PYTHONPATH": str(ROOT), "DEBUG": "1"}
    worker_log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - the worker writes it until the test ends
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", QUEUE, "--concurrency", "4", "--poll-interval", "0.05"],
        cwd=ROOT, env=env, stdout=worker_log, stderr=subprocess.STDOUT,
    )
    try:
        with serve(env, log_path=tmp_path / "daphne.log") as base:
            yield base
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
        worker_log.close()


def _number(page, selector: str) -> int:
    return int(page.locator(selector).first.inner_text().replace(",", "").strip())


def _wait_number(page, selector: str, predicate, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while True:
        value = _number(page, selector)
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: still {value}")
        page.wait_for_timeout(100)


def test_the_operator_scenario_and_a_read_only_colleague(stack, redis):
    from playwright.sync_api import expect, sync_playwright

    base = stack
    redis.set(GATEWAY_DOWN, "1")
    queue = Queue(QUEUE, redis_client=redis)
    queue.add(RENDER, [0])  # registers the queue before the browser looks

    with sync_playwright() as p:
        browser = launch(p)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            log_in(page, base, "olga", "olga-password")
            wait_live(page)
            page.evaluate("window.__sameDocument = true")

            # Jobs fail while the gateway is down: one every 250 ms, so retries keep coming for seconds.
            def produce():
                for n in range(1, 9):
                    queue.add(CHARGE, [n])
                    time.sleep(0.25)
                for n in range(1, 3):
                    queue.add(RENDER, [n])

            producer = threading.Thread(target=produce)
            producer.start()
            retries = "#ov-cards [data-metric=retried-5m]"
            seen = [_number(page, retries)]
            deadline = time.monotonic() + 40
            while seen[-1] < 16 and time.monotonic() < deadline:  # 8 jobs x 2 retries
                page.wait_for_timeout(100)
                value = _number(page, retries)
                if value != seen[-1]:
                    seen.append(value)
            producer.join()
            assert seen[-1] == 16, seen
            assert len(seen) >= 3 and seen == sorted(seen), f"the retry counter should climb live: {seen}"
            assert page.evaluate("window.__sameDocument") is True  # updated in place, never reloaded

            dlq = "#ov-cards [data-metric=dlq]"
            _wait_number(page, dlq, lambda v: v == 11, 30, "11 dead letters (8 charges, 3 invoices)")

            # A second tab keeps the overview open while the operator works in the DLQ.
            watcher = ctx.new_page()
            watcher.goto(f"{base}/")
            wait_live(watcher)
            assert _number(watcher, dlq) == 11

            redis.delete(GATEWAY_DOWN)  # the gateway is back
            page.goto(f"{base}/queues/{QUEUE}/dlq/")
            page.fill("input[name=q]", "gateway timed out")
            page.click("form.filters button[type=submit]")
            page.wait_for_url("**q=gateway+timed+out**")
            rows = page.locator("tr[data-entry]")
            expect(rows).to_have_count(8)
            page.check("[data-select-all]")
            expect(page.locator("[data-selected-count]")).to_have_text("8 ticked")
            page.click("button[value=replay-selected]")
            expect(page.locator("h1[data-confirm-count]")).to_contain_text("Replay 8 entries?")
            page.click("[data-confirm-button]")
            expect(page.locator(".messages")).to_contain_text("Replayed 8 entries")
            assert "q=gateway+timed+out" in page.url  # back on the filtered view

            # The other tab sees the DLQ fall and the replayed jobs complete, live.
            _wait_number(watcher, dlq, lambda v: v == 3, 15, "the DLQ count to fall to 3")
            _wait_number(watcher, "#ov-cards [data-metric=completed-5m]", lambda v: v >= 8, 20,
                         "the replayed jobs to complete")

            # The invoices cannot be saved: discard them, after a confirmation that counts them.
            page.goto(f"{base}/queues/{QUEUE}/dlq/?q=template+missing")
            expect(page.locator("tr[data-entry]")).to_have_count(3)
            page.click("button[value=discard-matching]")
            expect(page.locator("h1[data-confirm-count]")).to_contain_text("Discard 3 entries for good?")
            page.click("[data-confirm-button]")
            expect(page.locator(".messages")).to_contain_text("Discarded 3 entries")
            _wait_number(page, "#dlq-live [data-metric=dlq]", lambda v: v == 0, 10, "an empty DLQ")
            _wait_number(watcher, dlq, lambda v: v == 0, 10, "an empty DLQ on the overview")
            assert redis.xlen(KEYS.dlq) == 0 and redis.xlen(KEYS.stream) == 0
            ctx.close()

            # A read-only colleague behind a proxy that refuses websockets: the same pages, kept
            # fresh by polling, and no way to change anything.
            queue.add(RENDER, [99])
            _wait_for(lambda: redis.xlen(KEYS.dlq) == 1, 15, "one more dead letter")
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            ctx.add_init_script(REFUSED_WEBSOCKETS)
            page = ctx.new_page()
            log_in(page, base, "vera", "vera-password", next_path=f"/queues/{QUEUE}/dlq/")
            expect(page.locator("#live-pill")).to_have_attribute("data-state", "poll")
            expect(page.locator("tr[data-entry]")).to_have_count(1)
            queue.add(RENDER, [100])
            _wait_number(page, "#dlq-live [data-metric=dlq]", lambda v: v == 2, 15, "the polled DLQ count to rise")
            for path in (f"/queues/{QUEUE}/dlq/", f"/queues/{QUEUE}/", f"/queues/{QUEUE}/dlq/?view=groups"):
                page.goto(f"{base}{path}")
                expect(page.locator("main form[method=post]")).to_have_count(0)
                expect(page.locator("main input[type=checkbox]")).to_have_count(0)
            page.locator("tr[data-fingerprint] a").first.click()  # the group's sample: its newest entry
            expect(page.locator("pre[data-args]")).to_contain_text("100")
            expect(page.locator("main form[method=post]")).to_have_count(0)
            ctx.close()
        finally:
            browser.close()


def test_schedules_page_runs_pauses_and_resumes_a_schedule(stack, redis):
    """The operator runs a schedule's job by hand, sees it succeed, pauses and resumes it; a viewer only looks."""
    from playwright.sync_api import expect, sync_playwright

    base = stack
    with sync_playwright() as p:
        browser = launch(p)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            page.on("dialog", lambda dialog: dialog.accept())
            log_in(page, base, "olga", "olga-password", next_path="/schedules/")
            row = page.locator("tr[data-schedule=monthly-statements]")
            expect(row).to_contain_text("cron 0 3 1 * * (America/Lima)")
            expect(row.locator("[data-recent]")).to_contain_text("not fired yet")

            row.locator("button[data-action=run]").click()
            expect(page.locator(".messages")).to_contain_text("Schedule monthly-statements: job schedule:")
            # the worker runs it; the table refreshes itself until the outcome shows
            expect(row.locator("[data-outcome=SUCCESSFUL]")).to_have_count(1, timeout=20_000)
            expect(row.locator("[data-recent]")).to_contain_text("manual by olga")

            row.locator("button[data-action=pause]").click()
            expect(page.locator(".messages")).to_contain_text("Schedule monthly-statements is paused")
            expect(row.locator(".badge-paused")).to_have_text("paused")
            expect(row.locator("[data-next]")).to_have_text("—")
            row.locator("button[data-action=resume]").click()
            expect(page.locator(".messages")).to_contain_text("fires again")
            expect(row.locator(".badge-paused")).to_have_count(0)
            ctx.close()

            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            log_in(page, base, "vera", "vera-password", next_path="/schedules/")
            expect(page.locator("tr[data-schedule=monthly-statements]")).to_contain_text("successful")
            expect(page.locator("main form[method=post]")).to_have_count(0)
            ctx.close()
        finally:
            browser.close()
    from chasqui_core.models import AuditEntry

    audited = list(AuditEntry.objects.order_by("id").values_list("action", "actor_repr", "source"))
    assert audited == [("schedule_run", "olga", "console"), ("schedule_pause", "olga", "console"),
                       ("schedule_resume", "olga", "console")]


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
