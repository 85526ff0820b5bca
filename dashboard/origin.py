"""Whether a websocket was opened by a page of this site: the console's own guard against cross-site sockets.

A browser sends the session cookie with a websocket whatever page opens it,
and websockets are not bound by the same-origin policy: without a check, a
page on any site could open the console's live socket as the logged-in
operator and read the stream. Channels' ``AllowedHostsOriginValidator`` does
that check only if a project's ``asgi.py`` wraps the routes in it, and it
lets every origin through when ``ALLOWED_HOSTS`` is ``["*"]``. So the
consumer checks by itself, the way Django's CSRF check judges a POST's
``Origin``: the origin must be the host that serves the socket (its ``Host``
header, which must be one of ``ALLOWED_HOSTS``), or be listed in
``CSRF_TRUSTED_ORIGINS`` (a console served under another name by a proxy).

The scheme is not compared: behind a proxy that ends TLS, the socket arrives
as ``ws`` for a page served over ``https``; an ``http`` page on the same host
is the same site. A socket without an ``Origin`` is refused: browsers always
send one, and anything else can send whatever it likes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

_DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]
"""Django's own default when DEBUG is on and ALLOWED_HOSTS is empty (HttpRequest.get_host)."""


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _allowed_hosts() -> list[str]:
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:
        return _DEBUG_HOSTS
    return hosts


def _trusted(origin: str, scheme: str, netloc: str, trusted: Iterable[str]) -> bool:
    """Django's reading of CSRF_TRUSTED_ORIGINS: exact origins, or ``scheme://*.domain`` for its subdomains."""
    for entry in trusted:
        if entry == origin:
            return True
        if "://*." in entry:
            entry_scheme, _, pattern = entry.partition("://*")
            if entry_scheme == scheme and is_same_domain(netloc, pattern):
                return True
    return False


def same_site(scope: Mapping[str, Any]) -> bool:
    """True when the socket's ``Origin`` is the host serving it (an allowed host) or a trusted origin."""
    origin = _header(scope, b"origin")
    if not origin or origin == "null":
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    netloc = parts.netloc.lower()
    if _trusted(origin, parts.scheme, netloc, getattr(settings, "CSRF_TRUSTED_ORIGINS", ())):
        return True
    host = (_header(scope, b"host") or "").lower()
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, _allowed_hosts()):
        return False
    default_port = {"http": "80", "https": "443"}[parts.scheme]
    return netloc == host or f"{netloc}:{default_port}" == host
