"""URL routes of the project."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard.views import home
from emails.views import signup

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("signup/", signup, name="signup"),
    # The HTTP API mounts here:
    # path("api/", api.urls),
]
