"""The console's socket refuses pages of other sites by itself, whatever the project's asgi.py wraps it in.

The routes are mounted here as the quickstart's first version did: session
auth and the URL router, without Channels' AllowedHostsOriginValidator, and
with ALLOWED_HOSTS = ["*"], under which that validator lets any origin in.
"""

from __future__ import annotations

import pytest
from channels.auth import AuthMiddlewareStack
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from dashboard.routing import websocket_urlpatterns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

BARE = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))


@pytest.fixture(autouse=True)
def memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.ALLOWED_HOSTS = ["*"]
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def socket(cookie: bytes, origin: bytes | None, host: bytes = b"console.example") -> WebsocketCommunicator:
    headers = [(b"host", host), (b"cookie", cookie)]
    if origin is not None:
        headers.append((b"origin", origin))
    return WebsocketCommunicator(BARE, "/ws/live/overview/", headers=headers)


async def answer(ws: WebsocketCommunicator) -> tuple[bool, object]:
    connected, code = await ws.connect(timeout=10)
    await ws.disconnect()
    return connected, code


async def test_a_page_of_another_site_is_refused_at_the_handshake(viewer_cookie):
    connected, code = await answer(socket(viewer_cookie, b"http://evil.example"))
    assert not connected and code == 1000  # denied before accept: the browser sees a failed handshake


async def test_a_socket_without_an_origin_or_with_a_lookalike_is_refused(viewer_cookie):
    for origin in (
        None,
        b"null",
        b"http://console.example.evil.example",
        b"ftp://console.example",
        b"http://console.example:8443",
    ):
        connected, _ = await answer(socket(viewer_cookie, origin))
        assert not connected, origin


async def test_a_page_of_the_same_site_is_accepted(viewer_cookie):
    for origin, host in (
        (b"https://console.example", b"console.example"),
        (b"http://console.example:8000", b"console.example:8000"),
        (b"https://console.example", b"console.example:443"),
    ):
        connected, _ = await answer(socket(viewer_cookie, origin, host))
        assert connected, (origin, host)


async def test_a_host_outside_allowed_hosts_is_refused_even_from_itself(viewer_cookie, settings):
    settings.ALLOWED_HOSTS = ["console.example"]
    connected, _ = await answer(socket(viewer_cookie, b"http://other.example", b"other.example"))
    assert not connected
    connected, _ = await answer(socket(viewer_cookie, b"http://console.example", b"console.example"))
    assert connected


async def test_a_trusted_origin_is_accepted_from_another_name(viewer_cookie, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://ops.example", "https://*.corp.example"]
    for origin in (b"https://ops.example", b"https://console.corp.example"):
        connected, _ = await answer(socket(viewer_cookie, origin, b"internal:8000"))
        assert connected, origin
    connected, _ = await answer(socket(viewer_cookie, b"http://ops.example", b"internal:8000"))
    assert not connected  # a trusted origin is trusted with its scheme
