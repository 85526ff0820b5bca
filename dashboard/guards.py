"""Who may open console pages, and how service-layer refusals reach the operator.

Every page needs a logged-in user with ``chasqui_core.view_queues``. A user
who is logged in but lacks it gets a 403 page that says which permission to
ask for, rather than a login loop. Changes are checked again by the service
layer, whatever the page showed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from urllib.parse import quote

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.views.decorators.http import require_POST
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chasqui_core import access
from chasqui_core.services.common import NotFound


def forbidden(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "chasqui_console/forbidden.html", {"message": message}, status=403)


def console_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Login plus the view permission; 404 for unknown queues, 403 for refused changes, 503 without Redis."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            if request.htmx:
                # An htmx poll must not swap the login page into a fragment: send the whole tab there.
                response = HttpResponse(status=401)
                page = request.htmx.current_url_abs_path or "/"
                response["HX-Redirect"] = f"{resolve_url(settings.LOGIN_URL)}?next={quote(page)}"
                return response
            return redirect_to_login(request.get_full_path())
        if not access.has(request.user, access.VIEW):
            return forbidden(request, f"Your account cannot see the console: ask an administrator for the "
                                      f"'{access.full_name(access.VIEW)}' permission "
                                      f"(or the \u201c{access.VIEWERS}\u201d group).")
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return forbidden(request, str(exc) or "You do not have permission to do this.")
        except NotFound as exc:
            return render(request, "chasqui_console/not_found.html", {"message": str(exc)}, status=404)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            return render(request, "chasqui_console/unavailable.html", {"message": str(exc)}, status=503)

    return wrapper


def console_action(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A change: POST only (Django's CSRF middleware checks the token), plus ``console_page``."""
    return console_page(require_POST(view))
