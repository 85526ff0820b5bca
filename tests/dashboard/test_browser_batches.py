"""A workflow's page in a real browser: headless Chromium (Debian's) driven by Playwright, against Daphne started
as a subprocess on the test database and Redis.

A batch whose two children died shows **Replay 2 dead** to an operator; pressing it (and accepting the
confirmation) replays both through the dead-letter queue, says so, and the audit log names the operator; as they
succeed, the open page follows over its websocket, without a reload. A viewer sees no button.
"""

from __future__ import annotations

import os

import pytest

from chasqui_core.engine.flows import batches
from chasqui_core.engine.flows.compose import BatchSpec, start_batch
from chasqui_core.engine.producer.queue import JobSpec, Queue
from dashboard.screenshots import CHROMIUM, launch, log_in, serve
from tests.dashboard.e2e_app import QUEUE
from tests.engine.test_flows import registry
from tests.engine.worker_app import wait_for
from tests.helpers import ROOT, subprocess_database_url, worker_running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


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


def test_the_replay_button_replays_a_batchs_dead_children(site, redis, redis_url, viewer):
    from playwright.sync_api import expect, sync_playwright

    from chasqui_core.models import AuditEntry

    q = Queue(QUEUE, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec("square", [2]), JobSpec("fail"), JobSpec("fail")],
                                       on_success=JobSpec("echo", ["ok"])))
    with worker_running(redis_url, [QUEUE], registry(redis)):
        wait_for(lambda: batches.read(redis, started.id).ended == 3, 60, "every child ended")
    assert redis.xlen(q.keys.dlq) == 2
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            log_in(page, site, "olga", "olga-password", next_path=f"/batches/{started.id}/")
            expect(page.locator("#batch-live [data-state]")).to_have_text("failed")
            expect(page.locator("[data-dead]")).to_have_text("2")
            page.on("dialog", lambda dialog: dialog.accept())
            page.locator('button[data-action="replay-dead"]').click()
            page.wait_for_url(f"{site}/batches/{started.id}/")
            expect(page.locator(".messages")).to_contain_text(f"2 jobs of {started.id} replayed")
            assert redis.xlen(q.keys.dlq) == 0, "both dead children went back to work"
            redis.set("fixed", 1)
            with worker_running(redis_url, [QUEUE], registry(redis)):  # the open page follows them live
                expect(page.locator("#batch-live [data-state]")).to_have_text("succeeded", timeout=60_000)
                expect(page.locator("#batch-live [data-succeeded]")).to_have_text("3")

            other = browser.new_page()
            log_in(other, site, viewer.username, f"{viewer.username}-password", next_path=f"/batches/{started.id}/")
            expect(other.locator("[data-batch-id]")).to_have_text(started.id)
            expect(other.locator('button[data-action="replay-dead"]')).to_have_count(0)
        finally:
            browser.close()
    entry = AuditEntry.objects.get(action="replay")  # outside Playwright's loop: the ORM is sync-only
    assert entry.actor.username == "olga" and entry.source == "console" and entry.count == 2
