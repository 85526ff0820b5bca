"""The console's own login and logout: for every user who may see the console, staff or not.

A project's login page may not be usable by operators: the admin's
(``admin:login``) turns away anyone who is not staff, and members of the
"Chasqui viewers" group usually are not. So the console ships one, through
Django's own LoginView (the project's authentication backends, its
throttling such as django-axes, and its ``next`` checks apply), and a project
points ``LOGIN_URL`` at it (``"chasqui_console:login"``) or at its own.
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import reverse_lazy


class ConsoleLoginView(auth_views.LoginView):
    template_name = "chasqui_console/login.html"
    next_page = reverse_lazy("chasqui_console:overview")


class ConsoleLogoutView(auth_views.LogoutView):
    next_page = reverse_lazy("chasqui_console:login")


login = ConsoleLoginView.as_view()
logout = ConsoleLogoutView.as_view()
