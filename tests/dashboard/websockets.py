"""Talking to the console's websocket through the project's real ASGI stack (origin check, session auth)."""

from __future__ import annotations

import re
import time

from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application


def session_cookie(user) -> bytes:
    """The ``Cookie`` header of a browser in which ``user`` has logged in."""
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def live_socket(path: str, cookie: bytes | None = None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


async def refused_with(path: str, cookie: bytes | None) -> int:
    """The close code a socket gets when the console turns it away."""
    ws = live_socket(path, cookie)
    connected, _ = await ws.connect()
    assert connected  # accepted only to say why it closes
    message = await ws.receive_output(timeout=5)
    assert message["type"] == "websocket.close"
    await ws.wait()
    return message["code"]


async def next_fragment(ws: WebsocketCommunicator, marker: str, timeout: float = 10) -> str:
    """The next fragment holding ``marker``; fragments of other parts of the page are skipped."""
    deadline = time.monotonic() + timeout
    while True:
        html = await ws.receive_from(timeout=max(0.1, deadline - time.monotonic()))
        if marker in html:
            return html


def figure(html: str, name: str) -> int:
    """The number shown in the element marked ``data-metric="<name>"``."""
    m = re.search(rf'data-metric="{name}"[^>]*>([\d,]+)<', html)
    assert m, f"no {name} figure in the fragment"
    return int(m[1].replace(",", ""))
