"""The grouped DLQ view in a real browser: every dead job counted, the counts adding up to the DLQ's length.

The DLQ is written the way a worker writes it (``settle.lua``, through the
bench's builder), with more error groups than the page lists, so the last row
counts the groups left out. A small group's "Entries" link then lists its
entries on one complete page, without an "Older" link to click through.
"""

from __future__ import annotations

import os

import pytest

from bench.console_scale import build_dead
from chasqui_core.engine.store.keys import QueueKeys
from dashboard.screenshots import CHROMIUM, launch, log_in, serve
from tests.dashboard.e2e_app import QUEUE
from tests.dashboard.test_browser import ROOT
from tests.helpers import subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

KEYS = QueueKeys.for_queue(QUEUE)
KINDS = [(f"shop.errors.Failure{k}", f"step {k} of the order {{n}} failed") for k in range(230)]
"""230 error groups: more than the 200 the grouped view lists."""


@pytest.fixture(scope="module", autouse=True)
def _chromium():
    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing")
        pytest.skip(f"{CHROMIUM} is missing")


def _count(text: str) -> int:
    return int(text.replace(",", "").strip())


def test_the_grouped_view_counts_every_dead_job(redis, redis_url, operator):
    from playwright.sync_api import expect, sync_playwright

    # 4,600 dead jobs over 230 groups (20 each), and 3 more of a group of their own
    build_dead(redis, QUEUE, 4600, kinds=KINDS)
    build_dead(redis, QUEUE, 3, start=4600, kinds=[("shop.errors.Rare", "the ledger {n} is locked")])
    total = redis.xlen(KEYS.dlq)
    assert total == 4603

    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": subprocess_database_url(),
           "DJANGO_SETTINGS_MODULE": "tests.dashboard.e2e_settings", "PYTHONPATH": str(ROOT), "DEBUG": "1"}
    with serve(env) as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            log_in(page, base, "olga", "olga-password", next_path=f"/queues/{QUEUE}/dlq/?view=groups")
            rows = page.locator("tr[data-fingerprint]")
            expect(rows).to_have_count(200)
            expect(page.locator("[data-grouping=whole]")).to_contain_text("every entry is counted")
            listed = [_count(t) for t in page.locator("tr[data-fingerprint] td:first-child").all_inner_texts()]
            rest = page.locator("tr.other-groups")
            expect(rest).to_contain_text("31 smaller groups not listed")
            others = _count(rest.locator("td").first.inner_text())
            assert sum(listed) + others == total, "the counts on the page add up to the DLQ's length"
            assert listed == sorted(listed, reverse=True)

            # a group too small to be listed: filter on it by its id, as the group's Entries link does
            rare = redis.zrange(KEYS.dlq + ":ix:groups", 0, 0)[0].decode()
            page.goto(f"{base}/queues/{QUEUE}/dlq/?fp={rare}")
            expect(page.locator("tr[data-entry]")).to_have_count(3)
            expect(page.locator("a[data-next]")).to_have_count(0)

            # and a listed one, through its link: a full first page, newest first
            page.goto(f"{base}/queues/{QUEUE}/dlq/?view=groups")
            first = page.locator("tr[data-fingerprint]").first
            first.get_by_role("link", name="Entries").click()
            expect(page.locator("tr[data-entry]")).to_have_count(20)
            expect(page.locator("a[data-next]")).to_have_count(0)
        finally:
            browser.close()
