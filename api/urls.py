"""The API with ``/metrics`` and ``/healthz``, for a project to mount under a prefix of its choosing.

``path("chasqui/api/", include("chasqui_core.api.urls"))`` serves the API at
``chasqui/api/``, its documentation at ``chasqui/api/docs`` and the monitoring
views at ``chasqui/api/metrics`` and ``chasqui/api/healthz``. (This project
mounts them itself, in config/urls.py, with the monitoring views at the root.)
"""

from django.urls import path

from .api import api
from .monitoring import healthz, metrics

urlpatterns = [
    path("metrics", metrics, name="chasqui-metrics"),
    path("healthz", healthz, name="chasqui-healthz"),
    path("", api.urls),
]
