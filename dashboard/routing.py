"""Websocket routes of the console, mounted by config.asgi."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
