"""The queue page's history panel: failures and run time per task over 1 hour, 24 hours or 7 days."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from chasqui_core.engine.ops import history, totals
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.store.scripts import Scripts
from tests.helpers import keys_matching

pytestmark = pytest.mark.django_db

Q = "emails"
KEYS = QueueKeys.for_queue(Q)


def _client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _settle(redis, tasks, durations, failed=()):
    flat = totals.duration_increments(list(tasks), list(durations), list(failed))
    for field, amount in zip(flat[::2], flat[1::2], strict=True):
        redis.hincrby(KEYS.durations, field, amount)


def test_the_queue_page_shows_each_tasks_runs_failures_and_run_time(viewer, redis):
    Queue(Q, redis_client=redis).add("emails.tasks.send", [1])
    _settle(redis, ["emails.tasks.send"] * 3, [40, 40, 900], ["emails.tasks.send"])
    html = _client(viewer).get(f"/queues/{Q}/").content.decode()
    row = re.search(r'<tr data-task="emails.tasks.send">.*?</tr>', html, re.S)[0]
    assert re.search(r'data-col="runs">3<', row) and re.search(r'data-col="failures">1<', row)
    assert "50 ms" in row and "1,000 ms" in row  # p50 and p95 bucket bounds
    assert 'data-range="1h"' in html and re.search(r'data-range="1h"[^>]*aria-current="page"', html, re.S)
    assert "all-time figures" in html, "without a snapshot the panel says its figures are all-time"


def test_the_range_picker_swaps_the_panel_and_counts_from_the_ranges_snapshot(viewer, redis):
    Queue(Q, redis_client=redis).add("emails.tasks.send", [1])
    _settle(redis, ["emails.tasks.send"] * 5, [3] * 5)
    history.snapshot(Scripts(redis), KEYS)
    hour = int(redis.time()[0]) // 3600
    [hourly] = keys_matching(redis, f"{KEYS.metrics}snap:1h:*")
    redis.rename(hourly, f"{KEYS.metrics}snap:1h:{hour - 24}")  # as if taken a day ago
    _settle(redis, ["emails.tasks.send"] * 2, [3, 3])
    c = _client(viewer)
    panel = c.get(f"/queues/{Q}/history/?range=24h", HTTP_HX_REQUEST="true").content.decode()
    assert panel.startswith('<section class="panel" id="history"') or 'id="history"' in panel[:200]
    assert "<html" not in panel, "the picker gets the panel alone"
    assert re.search(r'data-range="24h"[^>]*aria-current="page"', panel, re.S)
    assert re.search(r'data-col="runs">2<', panel), "only the runs since the day-old snapshot"
    assert "Failed runs per 15 minutes, last 24 hours" in panel
    week = c.get(f"/queues/{Q}/history/?range=7d").content.decode()
    assert "Failed runs per hour, last 7 days" in week
    assert c.get(f"/queues/{Q}/history/?range=bogus").status_code == 200  # falls back to the hour
    assert c.get("/queues/ghost/history/").status_code == 404


def test_the_overview_shows_every_queues_tasks_and_switches_range(viewer, redis):
    Queue(Q, redis_client=redis).add("emails.tasks.send", [1])
    Queue("billing", redis_client=redis).add("billing.tasks.charge", [1])
    _settle(redis, ["emails.tasks.send"] * 2, [3, 3], ["emails.tasks.send"])
    billing = QueueKeys.for_queue("billing")
    flat = totals.duration_increments(["billing.tasks.charge"] * 5, [30] * 5)
    for field, amount in zip(flat[::2], flat[1::2], strict=True):
        redis.hincrby(billing.durations, field, amount)
    c = _client(viewer)
    html = c.get("/").content.decode()
    assert "Failures and run time per task, every queue" in html
    rows = re.findall(r'<tr data-task="([^"]+)">', html)
    assert rows[:2] == ["billing: billing.tasks.charge", "emails: emails.tasks.send"], "busiest first"
    week = c.get("/history/?range=7d", HTTP_HX_REQUEST="true").content.decode()
    assert "Failed runs per hour, last 7 days" in week and 'hx-get="/history/?range=24h"' in week
