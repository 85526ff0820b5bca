"""Rate and concurrency limits as operators see them: the setting's checks, the API, /metrics and the queue page."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from chasqui_core.conf import load
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.worker_app import wait_for

from .test_monitoring import running_worker, scrape

pytestmark = pytest.mark.django_db

LIMITS = {"lim": {"rate": "100/m"}, "app.slow": {"concurrency": 1, "key": "customer"}}


@pytest.mark.parametrize(("setting", "message"), [
    ({"lim": {"rate": "fast"}}, r"settings.CHASQUI\['LIMITS'\]: LIMITS\['lim'\]\['rate'\] must read like '20/s'"),
    ({"lim": {"concurrency": 2, "per": "x"}}, r"unknown settings \['per'\]"),
    (["lim"], "must be a dict of queue or task name"),
])
def test_a_wrong_limits_setting_is_refused_at_start_in_words(setting, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        load({"LIMITS": setting})


@pytest.fixture
def held(redis, redis_url, settings):
    """A worker whose one ``app.slow`` run for acme holds its slot while two more of acme's jobs wait."""
    settings.CHASQUI = {"LIMITS": LIMITS}
    release = threading.Event()
    registry = HandlerRegistry()

    async def slow(**_):
        while not release.is_set():
            await asyncio.sleep(0.02)

    registry.register("app.slow", slow)
    q = Queue("lim", redis_client=redis)
    q.add_bulk([JobSpec("app.slow", kwargs={"customer": "acme"}) for _ in range(3)])
    with running_worker(redis_url, ["lim"], registry, concurrency=4, limits=LIMITS):
        yield q
        release.set()


def test_the_api_shows_what_each_limit_holds(held, redis, view_api):
    def limits():
        return {item["scope"]: item for item in view_api.get("/api/queues/lim/limits").json()["items"]}

    wait_for(lambda: limits().get("app.slow", {}).get("waiting") == 2, 20, "two jobs waiting on the limit")
    items = limits()
    assert list(items) == ["lim", "app.slow"]
    assert items["lim"]["setting"] == "100 per 60 s" and items["lim"]["started"] == 1
    slow = items["app.slow"]
    assert slow["setting"] == "1 at once per customer" and slow["running"] == 1
    assert slow["buckets"] == [{"bucket": "acme", "running": 1, "waiting": 2, "started": 0}]


def test_metrics_and_the_queue_page_show_the_limits(held, redis, view_api, viewer):
    wait_for(lambda: scrape(view_api.get("/metrics")).get(
        ("chasqui_limit_waiting_jobs", (("limit", "app.slow"), ("queue", "lim")))) == 2, 20, "the waiting jobs")
    figures = scrape(view_api.get("/metrics"))
    assert figures[("chasqui_limit_running_jobs", (("limit", "app.slow"), ("queue", "lim")))] == 1
    assert figures[("chasqui_limit_window_starts", (("limit", "lim"), ("queue", "lim")))] == 1
    assert figures[("chasqui_jobs_deferred_total", (("queue", "lim"),))] >= 2
    client = Client()
    client.force_login(viewer)
    html = client.get("/queues/lim/").content.decode()
    assert 'data-limit="app.slow"' in html and "1 at once per customer" in html and "acme" in html


def test_limits_need_the_view_permission(outsider_api, anon_api):
    assert outsider_api.get("/api/queues/lim/limits").status_code == 403
    assert anon_api.get("/api/queues/lim/limits").status_code == 401
