"""Big DLQ operations and text search in a real browser: headless Chromium against Daphne and a real worker.

A paced replay of a filtered set is confirmed, run by the worker (not by the
web server) at the pace asked, and followed live on the operation's page; a
text search fills its list as it reads the whole DLQ, and never shows a
masked secret.
"""

from __future__ import annotations

import time

import pytest

from chasqui_core.engine.jobs.envelope import Job, new_job_id, now_ms
from chasqui_core.engine.store.keys import QUEUES_REGISTRY
from chasqui_core.models import Operation
from dashboard.screenshots import launch, log_in
from tests.dashboard.test_browser import CHARGE, KEYS, QUEUE, _chromium, stack  # noqa: F401 - fixtures
from tests.helpers import bulk_dead, dead_fields, error_history

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def dead_charges(redis, n: int, *, kwargs=None) -> None:
    """``n`` dead charges that succeed when replayed (the gateway is up)."""
    redis.sadd(QUEUES_REGISTRY, QUEUE)
    [record] = error_history(["payment gateway timed out"], "ConnectionError")
    pipe = redis.pipeline(transaction=False)
    for i in range(n):
        job = Job(
            new_job_id(),
            CHARGE,
            [i],
            dict(kwargs or {}),
            attempt=3,
            created_at=now_ms(),
            max_attempts=3,
            errors=[record],
        )
        pipe.xadd(KEYS.dlq, dead_fields(job))
    pipe.execute()


def test_a_paced_replay_runs_in_the_worker_with_live_progress(stack, redis):  # noqa: F811 - the imported fixture
    from playwright.sync_api import expect, sync_playwright

    base = stack
    dead_charges(redis, 1500)
    bulk_dead(redis, QUEUE, 50, task="tests.dashboard.e2e_app.tasks.render_invoice")  # not in the filter
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            log_in(page, base, "olga", "olga-password", next_path=f"/queues/{QUEUE}/dlq/?task={CHARGE}")
            page.click("button[value=replay-matching]")
            expect(page.locator("h1[data-confirm-count]")).to_contain_text("Replay 1,500 entries?")
            page.fill("input[name=rate]", "300")
            page.click("button[data-confirm-button]")
            page.wait_for_url(f"{base}/operations/**")
            # the worker takes it and the page shows it moving, a few hundred a second
            expect(page.locator("#op-progress")).to_have_attribute("data-status", "running", timeout=10_000)
            expect(page.locator("#op-progress")).to_contain_text("paced at 300 jobs a second")
            seen = set()
            deadline = time.monotonic() + 60
            while True:
                done = int(page.locator("[data-done]").inner_text().replace(",", ""))
                seen.add(done)
                if page.locator("#op-progress").get_attribute("data-status") == "done":
                    break
                assert time.monotonic() < deadline, f"the replay did not end: {sorted(seen)}"
                page.wait_for_timeout(200)
            assert len([d for d in seen if 0 < d < 1500]) >= 2, f"no progress seen on the way: {sorted(seen)}"
            expect(page.locator("#op-progress")).to_contain_text("1,500 replayed")
            assert redis.xlen(KEYS.dlq) == 50
        finally:
            browser.close()
    op = Operation.objects.get()
    assert (op.options["rate"], op.filter, op.status, op.count) == (300, {"task": CHARGE}, "done", 1500)


def test_search_fills_a_live_list_and_never_shows_a_secret(stack, redis):  # noqa: F811 - the imported fixture
    from playwright.sync_api import expect, sync_playwright

    base = stack
    dead_charges(redis, 4000)
    dead_charges(redis, 3, kwargs={"coupon": "SPRING-4417", "card_token": "tok-SPRING-secret"})
    dead_charges(redis, 4000)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            log_in(page, base, "vera", "vera-password", next_path=f"/queues/{QUEUE}/dlq/")
            page.click("text=Search all text")
            page.fill("input[data-search-text]", "spring-4417")
            page.press("input[data-search-text]", "Enter")
            expect(page.locator("[data-search-state]")).to_have_text("done", timeout=30_000)
            expect(page.locator(".search-hit")).to_have_count(3)
            expect(page.locator("[data-found]")).to_have_text("3")
            expect(page.locator("[data-scanned]")).to_have_text("8,003")
            assert "tok-SPRING-secret" not in page.content()
            page.fill("input[data-search-text]", "tok-SPRING")
            page.press("input[data-search-text]", "Enter")
            expect(page.locator("[data-search-state]")).to_have_text("done", timeout=30_000)
            expect(page.locator("[data-no-match]")).to_be_visible()
            expect(page.locator(".search-hit")).to_have_count(0)
        finally:
            browser.close()


def test_a_stopped_replay_says_how_many_of_how_many_and_a_second_run_moves_at_once(stack, redis):  # noqa: F811
    """A filtered replay through the DLQ's index, stopped half way from its page, then run again."""
    from playwright.sync_api import expect, sync_playwright

    base = stack
    bulk_dead(redis, QUEUE, 3000, task="tests.dashboard.e2e_app.tasks.render_invoice")  # older, not in the filter
    dead_charges(redis, 2400)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("dialog", lambda dialog: dialog.accept())
            log_in(page, base, "olga", "olga-password", next_path=f"/queues/{QUEUE}/dlq/?task={CHARGE}")
            page.click("button[value=replay-matching]")
            expect(page.locator("h1[data-confirm-count]")).to_contain_text("Replay 2,400 entries?")
            page.fill("input[name=rate]", "200")
            page.click("button[data-confirm-button]")
            page.wait_for_url(f"{base}/operations/**")
            expect(page.locator("#op-progress")).to_have_attribute("data-status", "running", timeout=10_000)
            page.locator("button[data-action=cancel-operation]").click()
            expect(page.locator("#op-progress")).to_have_attribute("data-status", "cancelled", timeout=15_000)
            done = int(page.locator("[data-done]").inner_text().replace(",", ""))
            assert 0 < done < 2400
            expect(page.locator("[data-total]")).to_have_text("2,400")  # of all that matched, not of those handled

            page.goto(f"{base}/queues/{QUEUE}/dlq/?task={CHARGE}")
            page.click("button[value=replay-matching]")
            left = 2400 - done
            expect(page.locator("h1[data-confirm-count]")).to_contain_text(f"Replay {left:,} entries?")
            page.fill("input[name=rate]", "400")
            page.click("button[data-confirm-button]")
            page.wait_for_url(f"{base}/operations/**")
            # the entries the first run replayed are gone from the index: the second moves from its first chunk
            expect(page.locator("[data-done]")).not_to_have_text("0", timeout=5_000)
            expect(page.locator("#op-progress")).to_have_attribute("data-status", "done", timeout=60_000)
            expect(page.locator("#op-progress")).to_contain_text(f"{left:,} replayed")
            assert redis.xlen(KEYS.dlq) == 3000
        finally:
            browser.close()
