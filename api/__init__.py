"""The HTTP API (django-ninja)."""
