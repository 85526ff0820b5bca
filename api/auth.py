"""Who is calling: an API key or a logged-in browser session.

Scripts send ``Authorization: Bearer <key>``; keys are looked up by hash, and
revoked keys or inactive users are refused. Browsers use their Django
session; because a browser sends its cookie with any request a page makes,
every change (POST, PUT, PATCH, DELETE) by session must carry the CSRF token.
A key in a header is never sent by a browser on its own, so key requests need
no token. A caller with neither gets 401.

Each endpoint names the permission it needs (``needs("replay_jobs")``), and
it is checked here, right after authentication and before the request's
parameters and body are read: a caller without the permission learns nothing
from 404s or validation errors, only 403. Wrong keys are counted in Redis per
client address and key prefix (key_failures.py); past ``API_KEY_FAILURE_LIMIT``
in ``API_KEY_FAILURE_WINDOW`` seconds a wrong key gets 429, a right one is
still served.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from .client_address import client_address
from .key_failures import count_failure
from chasqui_core.services.api_keys import authenticate_api_key
from chasqui_core.services.common import require


class TooManyAttempts(Exception):
    """Too many wrong API keys from one address and key prefix: answered 429 with Retry-After."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            f"Too many requests with a wrong API key from this address; try again in {retry_after} s "
            "(requests with a valid key are served meanwhile)"
        )
        self.retry_after = retry_after


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class ApiKeyAuth(HttpBearer):
    """``Authorization: Bearer <key>``, keys created with ``manage.py chasqui apikey create``."""

    def __init__(self, permission: str | tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.permission = permission

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return user_for_key(request, token, self.permission)


def user_for_key(request: HttpRequest, token: str, permission: str | tuple[str, ...] | None = None) -> Any:
    """The user a bearer key belongs to, once it holds ``permission``; None for a wrong key.

    Shared by the API and the plain views that take keys (/metrics), so every
    wrong key counts against the same limit: TooManyAttempts for a wrong key
    once its address and prefix are over it (a right key is served whatever
    the count), PermissionDenied for a right key without the permission.
    """
    token = token.strip()
    user = authenticate_api_key(token)
    if user is None:
        retry_after = count_failure(client_address(request), token)
        if retry_after is not None:
            raise TooManyAttempts(retry_after)
        return None
    return _permitted(user, permission)


class SessionAuth(APIKeyCookie):
    """The Django session of a logged-in user, with CSRF enforced on changes."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, permission: str | tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.permission = permission

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
        return _permitted(user, self.permission)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:  # pragma: no cover - __call__ decides
        return None


def _permitted(user: Any, permission: str | tuple[str, ...] | None) -> Any:
    """The user, once it holds the permission (any one of a tuple); PermissionDenied (403) otherwise."""
    if permission is None:
        return user
    wanted = (permission,) if isinstance(permission, str) else permission
    for codename in wanted[:-1]:
        try:
            require(user, codename)
            return user
        except PermissionDenied:
            continue
    require(user, wanted[-1])
    return user


def needs(permission: str | tuple[str, ...]) -> list:
    """The ``auth`` of an endpoint that needs ``permission`` (or any one of several)."""
    return [ApiKeyAuth(permission), SessionAuth(permission)]
