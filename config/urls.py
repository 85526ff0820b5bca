"""URL routes of the project."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from api import monitoring
from api.api import api
from emails.views import signup

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("signup/", signup, name="signup"),
    path("api/", api.urls),
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
    # The operator console, at the root.
    path("", include("dashboard.urls")),
]
