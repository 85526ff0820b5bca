"""The console's websocket, through Channels' communicator and the project's real ASGI stack
(origin check, session auth), with the in-memory channel layer and a real Redis.

test_consumers_redis.py runs the socket over the production channel layer (channels_redis)."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.layers import channel_layers

from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RetryPolicy
from chasqui_core.engine.worker.worker import Worker
from dashboard.sampler import get_sampler
from dashboard.topics import Topic
from tests.dashboard.websockets import figure, live_socket, next_fragment, refused_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

QUEUE = "console-ws"


@pytest.fixture(autouse=True)
def memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CHASQUI_SAMPLER_INTERVAL = 0.1
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def test_an_anonymous_socket_is_refused():
    assert await refused_with("/ws/live/overview/", None) == 4401
    assert not get_sampler().running


async def test_a_socket_without_the_view_permission_is_refused(outsider_cookie):
    assert await refused_with("/ws/live/overview/", outsider_cookie) == 4403


async def test_a_socket_for_nothing_watchable_is_refused(viewer_cookie):
    assert await refused_with("/ws/live/operation/not-an-id/", viewer_cookie) == 4404


async def test_a_logged_in_socket_sees_retries_and_dead_letters_rise(viewer_cookie, redis, redis_url):
    Queue(QUEUE, redis_client=redis).add("noop", [0])  # registers the queue; a handler that works
    ws = live_socket(f"/ws/live/queue/{QUEUE}/", viewer_cookie)
    connected, _ = await ws.connect()
    assert connected
    first = await next_fragment(ws, 'id="q-cards"')
    assert figure(first, "retried-5m") == 0 and figure(first, "dlq") == 0
    assert 'hx-swap-oob="true"' in first

    def boom(n):
        raise ConnectionError(f"payment gateway timed out for order {n}")

    registry = HandlerRegistry()
    registry.register("charge", boom)
    registry.register("noop", lambda n: n)
    worker = Worker([QUEUE], registry, url=redis_url, install_signal_handlers=False, promoter_poll_interval=0.02,
                    policy=RetryPolicy(max_attempts=3, backoff=BackoffSpec.fixed(20)))
    runner = asyncio.create_task(worker.run())
    try:
        queue = Queue(QUEUE, redis_client=redis)
        for n in range(5):
            queue.add("charge", [n])
        deadline = time.monotonic() + 20
        retried = dead = 0
        while (retried < 10 or dead < 5) and time.monotonic() < deadline:
            html = await next_fragment(ws, 'id="q-cards"')
            retried, dead = figure(html, "retried-5m"), figure(html, "dlq")
        assert (retried, dead) == (10, 5)  # two retries each, then the dead-letter queue
    finally:
        worker.request_stop()
        await runner
        await ws.disconnect()


async def test_one_sampler_serves_every_socket_and_stops_with_the_last(viewer_cookie):
    sockets = [live_socket("/ws/live/overview/", viewer_cookie) for _ in range(3)]
    for ws in sockets:
        assert (await ws.connect())[0]
    sampler = get_sampler()
    for ws in sockets:
        await next_fragment(ws, 'id="ov-cards"')
    # One loop, one topic watched three times: each reading is rendered once and sent to the group.
    assert sampler.running
    assert dict(sampler._counts) == {Topic("overview"): 3}
    for ws in sockets:
        await ws.disconnect()
    deadline = time.monotonic() + 5
    while sampler.running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not sampler.running and sampler.topics == []


async def test_a_socket_closes_within_seconds_once_its_session_logs_out_elsewhere(viewer_cookie, redis):
    from asgiref.sync import sync_to_async
    from django.contrib.sessions.backends.base import SessionBase
    from django.utils.module_loading import import_string
    from django.conf import settings

    Queue(QUEUE, redis_client=redis).add("noop", [0])
    ws = live_socket(f"/ws/live/queue/{QUEUE}/", viewer_cookie)
    connected, _ = await ws.connect()
    assert connected
    await next_fragment(ws, 'id="q-cards"')
    key = viewer_cookie.decode().split("=", 1)[1]
    store: SessionBase = import_string(f"{settings.SESSION_ENGINE}.SessionStore")(key)
    await sync_to_async(store.delete)(key)  # what logging out in another tab does to the session
    logged_out = time.monotonic()
    while True:
        message = await ws.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            break
    assert message["code"] == 4401
    assert time.monotonic() - logged_out < 5


async def test_a_logged_in_socket_passes_its_session_checks_and_keeps_updating(viewer_cookie, redis, monkeypatch):
    """The session check runs on a socket still logged in: it must find the user and let fragments through."""
    from dashboard import consumers

    monkeypatch.setattr(consumers, "SESSION_CHECK_S", 0.05)
    Queue(QUEUE, redis_client=redis).add("noop", [0])
    ws = live_socket(f"/ws/live/queue/{QUEUE}/", viewer_cookie)
    connected, _ = await ws.connect()
    assert connected
    for _ in range(5):  # each one sent after at least one check
        await next_fragment(ws, 'id="q-cards"')
        await asyncio.sleep(0.06)
    await ws.disconnect()


async def test_a_first_failure_is_pushed_at_once_not_at_the_next_tick(viewer_cookie, redis, settings):
    """With ticks a minute apart, only the failure watch can bring the Failed/s card its first failure."""
    import re

    from chasqui_core.engine.store.keys import QueueKeys

    settings.CHASQUI_SAMPLER_INTERVAL = 60.0
    Queue(QUEUE, redis_client=redis).add("noop", [0])
    ws = live_socket("/ws/live/overview/", viewer_cookie)
    assert (await ws.connect())[0]
    try:
        first = await next_fragment(ws, 'id="ov-cards"')
        assert re.search(r'data-metric="failed-rate">0\.0<', first)
        sampler = get_sampler()
        early = sampler.early_ticks
        await asyncio.sleep(0.5)  # the watch has taken its baseline
        keys = QueueKeys.for_queue(QUEUE)
        seconds_now, _ = redis.time()
        # what settle.lua writes for a failed run: the second's bucket and the all-time counters
        redis.hincrby(f"{keys.second_counters}{seconds_now}", "failed", 1)
        redis.hincrby(keys.totals, "failed", 1)
        pushed = await next_fragment(ws, 'id="ov-cards"', timeout=10)
        assert not re.search(r'data-metric="failed-rate">0\.0<', pushed), "the failure is not on the card"
        assert sampler.early_ticks == early + 1
    finally:
        await ws.disconnect()
