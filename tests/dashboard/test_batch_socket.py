"""A workflow's page watches its topic over the console's websocket (a child's end reaches the open tab), and
through the polling fallback. Transactional: the sampler closes the database connections it used."""

from __future__ import annotations

import msgpack
import pytest
from channels.layers import channel_layers

from chasqui_core.engine.flows.compose import BatchSpec, start_batch
from chasqui_core.engine.producer.queue import JobSpec, Queue
from tests.dashboard.test_batch_pages import Q, _client, _finish_first
from tests.dashboard.websockets import live_socket, next_fragment, refused_with
from tests.helpers import TASK

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CHASQUI_SAMPLER_INTERVAL = 0.1
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def test_a_childs_end_reaches_a_socket_watching_its_batch(viewer_cookie, redis):
    q = Queue("emails", redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2]), JobSpec(TASK, [3, 4])]))
    ws = live_socket(f"/ws/live/batch/{started.id}/", viewer_cookie)
    connected, _ = await ws.connect()
    assert connected
    try:
        first = await next_fragment(ws, 'id="batch-live"')
        assert 'data-live-state="running"' in first and "data-succeeded>0<" in first
        _finish_first(redis, q, started, msgpack.packb("<b>x</b>"))
        html = first
        while "data-succeeded>1<" not in html:
            html = await next_fragment(ws, 'id="batch-live"')
        assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html, "a child's result is escaped"
    finally:
        await ws.disconnect()


async def test_a_batch_socket_needs_a_login_the_permission_and_a_batch_id(viewer_cookie, outsider_cookie):
    path = "/ws/live/batch/emails:01ARZ3NDEKTSV4RRFFQ69G5FAV/"
    assert await refused_with(path, None) == 4401
    assert await refused_with(path, outsider_cookie) == 4403
    assert await refused_with("/ws/live/batch/no-colon-here/", viewer_cookie) == 4404


def test_a_batch_page_watches_its_topic_and_the_polling_fallback_serves_its_live_part(viewer, redis):
    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2])]))
    page = _client(viewer).get(f"/batches/{started.id}/").content.decode()
    assert f'ws-connect="/ws/live/batch/{started.id}/"' in page and 'id="batch-live"' in page
    part = _client(viewer).get(f"/live/batch/{started.id}/").content.decode()
    assert 'hx-swap-oob="true"' in part and 'data-live-state="running"' in part and "<html" not in part
    _finish_first(redis, q, started, msgpack.packb(3))
    part = _client(viewer).get(f"/live/batch/{started.id}/").content.decode()
    assert 'data-live-state="succeeded"' in part and "data-succeeded>1<" in part
    assert 'data-action="replay-dead"' not in part, "a fragment goes to every watcher: never a button"
    assert _client(viewer).get("/live/batch/not-a-batch/").status_code == 404
