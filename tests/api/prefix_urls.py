"""The API mounted as the quickstart mounts it: under a prefix, through api/urls.py, with no middleware of ours."""

from django.urls import include, path

urlpatterns = [
    path("chasqui/api/", include("api.urls")),
]
