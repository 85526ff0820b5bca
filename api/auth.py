"""Who is calling: an API key or a logged-in browser session.

Scripts send ``Authorization: Bearer <key>``; keys are looked up by hash, and
revoked keys or inactive users are refused. Browsers use their Django
session; because a browser sends its cookie with any request a page makes,
every change (POST, PUT, PATCH, DELETE) by session must carry the CSRF token.
A key in a header is never sent by a browser on its own, so key requests need
no token. A caller with neither gets 401.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from chasqui_core.services import authenticate_api_key

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class ApiKeyAuth(HttpBearer):
    """``Authorization: Bearer <key>``, keys created with ``manage.py chasqui apikey create``."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return authenticate_api_key(token.strip())


class SessionAuth(APIKeyCookie):
    """The Django session of a logged-in user, with CSRF enforced on changes."""

    param_name = settings.SESSION_COOKIE_NAME

    def __call__(self, request: HttpRequest) -> Any:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None  # 401, whatever the method: not a CSRF failure
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise HttpError(
                403,
                "CSRF check failed: a change made with a session cookie must send the CSRF token "
                "(X-CSRFToken header); scripts should use an API key instead",
            )
        return user

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:  # pragma: no cover - __call__ decides
        return None
