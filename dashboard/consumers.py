"""The console's websocket: one socket per open page, fed by the sampler.

A socket watches one topic (taken from its path). It only receives: the
sampler sends rendered fragments to the topic's group and this consumer
passes them on. Sockets are accepted and then closed at once when refused,
so the browser learns why from the close code and does not keep retrying:
4401 without a logged-in user, 4403 without the view permission, 4404 for a
path that names nothing to watch.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from chasqui_core import access

from .sampler import get_sampler
from .topics import BadTopic, Topic

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


class LiveConsumer(AsyncWebsocketConsumer):
    topic: Topic | None = None

    async def connect(self) -> None:
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await database_sync_to_async(access.has)(user, access.VIEW):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        try:
            topic = Topic.parse(self.scope["url_route"]["kwargs"]["topic"])
        except BadTopic:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.topic = topic
        await self.channel_layer.group_add(topic.group, self.channel_name)
        get_sampler().subscribe(topic)

    async def disconnect(self, code: int) -> None:
        if self.topic is not None:
            get_sampler().unsubscribe(self.topic)
            await self.channel_layer.group_discard(self.topic.group, self.channel_name)
            self.topic = None

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """The console only listens; anything a client sends is ignored."""

    async def live_fragment(self, event: dict) -> None:
        await self.send(text_data=event["html"])
