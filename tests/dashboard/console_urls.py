"""The console mounted under a prefix, beside nothing of the demo's: how a project includes it."""

from django.urls import include, path

urlpatterns = [
    path("chasqui/", include("dashboard.urls")),
]
