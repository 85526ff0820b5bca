"""Finding a job from the console in a real browser: headless Chromium (Debian's) driven by Playwright,
against Daphne started as a subprocess on the test database and Redis.

Typing an id in the top bar's box and pressing Enter lands on the job's page; "/" puts the cursor in the
box; a dead job's page offers its replay and a waiting job's page shows its arguments masked.
"""

from __future__ import annotations

import os

import pytest

from chasqui_core.engine.producer.queue import Queue
from chasqui_core.masking import MASK
from dashboard.screenshots import CHROMIUM, launch, log_in, serve
from tests.dashboard.e2e_app import QUEUE
from tests.helpers import ROOT, add_dead, dead_job, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(scope="module", autouse=True)
def _chromium():
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: `make test` installs it when run as root (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def site(redis, redis_url, operator, tmp_path):
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": subprocess_database_url(),
           "DJANGO_SETTINGS_MODULE": "tests.dashboard.e2e_settings", "PYTHONPATH": str(ROOT), "DEBUG": "1"}
    with serve(env, log_path=tmp_path / "daphne.log") as base:
        yield base


def test_search_lands_on_the_job_page_and_slash_focuses_the_box(site, redis):
    from playwright.sync_api import expect, sync_playwright

    waiting = Queue(QUEUE, redis_client=redis).add("tests.dashboard.e2e_app.tasks.charge", [7],
                                                   {"card": {"number": "4242", "password": "hunter2"}})
    dead = dead_job(messages=("gateway said no",))
    add_dead(redis, QUEUE, dead)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            log_in(page, site, "olga", "olga-password", next_path="/audit/")

            box = page.locator("#job-search")
            expect(box).not_to_be_focused()
            page.keyboard.press("/")
            expect(box).to_be_focused()
            expect(box).to_have_value("")  # the slash itself is not typed

            page.keyboard.type(waiting.job_id)
            page.keyboard.press("Enter")
            page.wait_for_url(f"{site}/jobs/{waiting.job_id}/")
            expect(page.locator("[data-state]")).to_have_text("waiting")
            args = page.locator("pre[data-kwargs]")
            expect(args).to_contain_text(MASK)
            expect(args).to_contain_text("4242")
            assert "hunter2" not in page.content()

            page.keyboard.press("/")
            page.keyboard.type(dead.id)
            page.keyboard.press("Enter")
            page.wait_for_url(f"{site}/jobs/{dead.id}/")
            expect(page.locator("[data-state]")).to_have_text("dead")
            replay = page.locator('button[data-action="replay"]')
            expect(replay).to_be_visible()
            replay.click()
            page.wait_for_url(f"{site}/jobs/{dead.id}/")
            expect(page.locator("[data-state]")).to_have_text("waiting")

            page.keyboard.press("/")
            page.keyboard.type("no-such-job")
            page.keyboard.press("Enter")
            page.wait_for_url(f"{site}/jobs/no-such-job/")
            expect(page.locator("[data-not-found]")).to_contain_text("Searched")
        finally:
            browser.close()


def test_the_cancel_button_on_a_waiting_job_page_cancels_it(site, redis, viewer):
    """An operator cancels a waiting job from its page (a POST with the CSRF token, after a confirm); the page
    then says the cancel is requested, and the audit log names the operator. A viewer sees no button."""
    from playwright.sync_api import expect, sync_playwright

    from chasqui_core.engine.store.keys import QueueKeys
    from chasqui_core.models import AuditEntry

    waiting = Queue(QUEUE, redis_client=redis).add("tests.dashboard.e2e_app.tasks.charge", [7], {})
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            log_in(page, site, "olga", "olga-password", next_path=f"/jobs/{waiting.job_id}/")
            expect(page.locator("[data-state]")).to_have_text("waiting")
            page.on("dialog", lambda dialog: dialog.accept())
            page.locator('button[data-action="cancel-job"]').click()
            page.wait_for_url(f"{site}/jobs/{waiting.job_id}/")
            expect(page.locator("[data-cancel-requested]")).to_contain_text("it will not run")
            assert redis.hexists(QueueKeys.for_queue(QUEUE).cancel, waiting.job_id)

            other = browser.new_page()
            log_in(other, site, viewer.username, f"{viewer.username}-password", next_path=f"/jobs/{waiting.job_id}/")
            expect(other.locator("[data-state]")).to_have_text("waiting")
            expect(other.locator('button[data-action="cancel-job"]')).to_have_count(0)
        finally:
            browser.close()
    entry = AuditEntry.objects.get(action="cancel_job")  # outside Playwright's loop: the ORM is sync-only
    assert entry.actor.username == "olga" and entry.source == "console"
