"""ASGI entry point: HTTP goes to Django, websockets to the dashboard's consumers.

Run with ``daphne config.asgi:application`` (``make run`` does).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Set up Django (apps, models) before importing anything that uses models,
# such as Channels' auth middleware or the dashboard's consumers.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

import dashboard.routing  # noqa: E402

# Daphne started directly (not through `runserver`) serves no static files;
# in development let Django serve them so the admin has its CSS.
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(dashboard.routing.websocket_urlpatterns))
        ),
    }
)
