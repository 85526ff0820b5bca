"""Websocket routes of the console, mounted by config.asgi."""

from django.urls import URLPattern, re_path

from .consumers import LiveConsumer

websocket_urlpatterns: list[URLPattern] = [
    re_path(r"^ws/live/(?P<topic>[A-Za-z0-9_.:\-/]{1,200})/$", LiveConsumer.as_asgi()),
]
