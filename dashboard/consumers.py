"""The console's websocket: one socket per open page, fed by the sampler.

A socket watches one topic (taken from its path). It only receives: the
sampler sends rendered fragments to the topic's group and this consumer
passes them on. Sockets are accepted and then closed at once when refused,
so the browser learns why from the close code and does not keep retrying:
4401 without a logged-in user, 4403 without the view permission, 4404 for a
path that names nothing to watch. A socket opened by a page of another site
(``origin.same_site``) is refused at the handshake, before anything else,
whatever the project's ``asgi.py`` wraps the routes in: that page learns
nothing, not even whether its visitor is logged in.

A socket outlives the login it was opened with unless someone checks: a user
who logs out in another tab (or whose session an administrator ends) would
go on watching. So before passing a fragment on, at most every
``SESSION_CHECK_S`` seconds, the socket checks that its session still exists
and its user still may view: if not, it closes with 4401 or 4403. Fragments
come every sampler tick (1 s), so a logged-out session's sockets close within
about four seconds.
"""

from __future__ import annotations

import time

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from channels.generic.websocket import AsyncWebsocketConsumer

from chasqui_core import access

from .origin import same_site
from .sampler import get_sampler
from .topics import BadTopic, Topic

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404

SESSION_CHECK_S = 3.0
"""How often an open socket checks that its session still exists and its user may still view."""


class LiveConsumer(AsyncWebsocketConsumer):
    topic: Topic | None = None
    checked_at = 0.0

    async def connect(self) -> None:
        if not same_site(self.scope):
            await self.close()  # before accept: the handshake is denied (HTTP 403)
            return
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
        self.checked_at = time.monotonic()
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
        now = time.monotonic()
        if now - self.checked_at >= SESSION_CHECK_S:
            self.checked_at = now
            refusal = await database_sync_to_async(self._refusal)()
            if refusal:
                await self.disconnect(refusal)
                await self.close(code=refusal)
                return
        await self.send(text_data=event["html"])

    def _refusal(self) -> int:
        """0 while the socket's login still holds; else the code to close it with."""
        session, user = self.scope.get("session"), self.scope.get("user")
        key = getattr(session, "session_key", None)
        if session is None or key is None or not session.exists(key):
            return CLOSE_UNAUTHENTICATED
        if user is None or not user.is_authenticated:
            return CLOSE_UNAUTHENTICATED
        # the scope's user is a lazy wrapper: the model is the project's user model, not its type
        fresh = get_user_model()._default_manager.filter(pk=user.pk, is_active=True).first()
        if fresh is None:
            return CLOSE_UNAUTHENTICATED
        return 0 if access.has(fresh, access.VIEW) else CLOSE_FORBIDDEN
