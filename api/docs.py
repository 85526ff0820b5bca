"""The API's interactive documentation, with Swagger UI's files served by the API itself.

django-ninja serves Swagger UI's script and stylesheet through Django's
static files only when ``"ninja"`` is in ``INSTALLED_APPS``; otherwise its page
loads them from a CDN, so the documentation is blank offline, on a network
that blocks the CDN, or under a Content-Security-Policy that allows only the
site itself. A project following the quickstart has no reason to list
``ninja``. So the page here takes the same files from the installed
django-ninja package and serves them under the API's own prefix
(``docs/assets/<name>``): nothing to install, collect or allow.
"""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Any

import ninja
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.urls import reverse
from django.utils.html import escape
from ninja.openapi.docs import Swagger

ASSETS_DIR = Path(ninja.__file__).parent / "static" / "ninja"
ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-init.js", "favicon.svg", "favicon.png")
"""The files the page needs, and the only ones the asset view hands out."""

MAX_AGE = 24 * 3600

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title}</title>
  <link rel="stylesheet" href="{css}">
  <link rel="icon" href="{icon}" type="image/svg+xml">
</head>
<body data-csrf-token="{csrf}" data-api-csrf="{api_csrf}">
  <script type="application/json" id="swagger-settings">{settings}</script>
  <div id="swagger-ui"></div>
  <script src="{bundle}"></script>
  <script src="{init}"></script>
</body>
</html>
"""


class LocalSwagger(Swagger):
    """Swagger UI whose files come from the API's own ``docs/assets/`` URLs, never a CDN."""

    def render_page(self, request: HttpRequest, api: Any, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)

        def asset(name: str) -> str:
            return escape(reverse(f"{api.urls_namespace}:docs-asset", kwargs={**kwargs, "name": name}))

        csrf = get_token(request)  # the "Try it out" calls made with the session need the token
        page = _PAGE.format(
            title=escape(api.title),
            css=asset("swagger-ui.css"),
            icon=asset("favicon.svg"),
            bundle=asset("swagger-ui-bundle.js"),
            init=asset("swagger-ui-init.js"),
            csrf=escape(csrf),
            api_csrf="true",
            # JSON inside a script element: "</" must not end it early
            settings=json.dumps(self.settings, indent=1).replace("</", "<\\/"),
        )
        return HttpResponse(page, content_type="text/html; charset=utf-8")


def asset(request: HttpRequest, name: str, **kwargs: Any) -> FileResponse:
    """One of Swagger UI's files, from the installed django-ninja package; 404 for any other name."""
    if name not in ASSETS:
        raise Http404("No such documentation asset")
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    response = FileResponse(open(ASSETS_DIR / name, "rb"), content_type=content_type)  # noqa: SIM115 - closed by it
    response["Cache-Control"] = f"public, max-age={MAX_AGE}"
    return response
