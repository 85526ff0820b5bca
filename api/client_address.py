"""The address a request comes from, as CHASQUI["TRUSTED_PROXIES"] says to read it."""

from __future__ import annotations

from django.http import HttpRequest

from chasqui_core.conf import chasqui_settings


def client_address(request: HttpRequest) -> str:
    """REMOTE_ADDR, or behind a trusted proxy the client it forwarded for; "unknown" when there is none."""
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    remote = request.META.get("REMOTE_ADDR", "") or ""
    return chasqui_settings().client_address(remote, forwarded) or "unknown"
