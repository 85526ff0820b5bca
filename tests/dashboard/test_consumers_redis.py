"""The console's websocket over the channel layer production uses: channels_redis on the project's Redis.

The other consumer tests use Channels' in-memory layer, which never serialises a message nor keeps a group
anywhere but in the process; these make sure the sampler's fragments also reach a socket through Redis:
channels_redis's RedisChannelLayer on one server, its pub/sub layer on a Redis Cluster.
"""

from __future__ import annotations

import pytest
from channels.layers import channel_layers, get_channel_layer
from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

from chasqui_core.engine.store.connection import is_cluster_client

from chasqui_core.engine.producer.queue import Queue
from dashboard.topics import Topic
from tests.dashboard.websockets import figure, live_socket, next_fragment, refused_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

QUEUE = "console-redis-ws"


@pytest.fixture(autouse=True)
def redis_layer(settings, redis_url):
    """The layer the project's settings configure, rebuilt for this test's event loop."""
    assert settings.CHANNEL_LAYERS["default"] == {
        "BACKEND": "chasqui_core.channel_layer.redis_channel_layer", "CONFIG": {"hosts": [redis_url]},
    }, "the project's settings no longer put the channel layer on REDIS_URL: update these tests"
    settings.CHASQUI_SAMPLER_INTERVAL = 0.1
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def test_jobs_added_to_a_queue_reach_a_logged_in_socket_through_redis(viewer_cookie, redis):
    cluster = is_cluster_client(redis)
    assert isinstance(get_channel_layer(), RedisPubSubChannelLayer if cluster else RedisChannelLayer)
    queue = Queue(QUEUE, redis_client=redis)
    queue.add("noop", [0])  # registers the queue
    ws = live_socket(f"/ws/live/queue/{QUEUE}/", viewer_cookie)
    connected, _ = await ws.connect()
    assert connected
    try:
        first = await next_fragment(ws, 'id="q-cards"')
        assert figure(first, "stream") == 1
        if not cluster:  # pub/sub keeps nothing: the membership is the subscription
            group_key = f"{get_channel_layer().prefix}:group:{Topic('queue', QUEUE).group}"
            assert redis.zcard(group_key) == 1, "the socket's group membership is kept in Redis"

        for n in range(1, 4):
            queue.add("noop", [n])
        shown = 1
        while shown != 4:
            shown = figure(await next_fragment(ws, 'id="q-cards"'), "stream")
    finally:
        await ws.disconnect()
    if not cluster:
        assert redis.zcard(group_key) == 0, "a closed socket leaves its group"


async def test_sockets_are_refused_without_a_login_or_the_view_permission(outsider_cookie):
    assert await refused_with(f"/ws/live/queue/{QUEUE}/", None) == 4401
    assert await refused_with(f"/ws/live/queue/{QUEUE}/", outsider_cookie) == 4403
