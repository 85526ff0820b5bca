"""Project configuration: settings, URLs and the ASGI/WSGI entry points."""
