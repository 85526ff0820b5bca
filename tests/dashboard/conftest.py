"""Fixtures of the console tests: users with each level of access, a clean
Redis, and the console's per-process state reset between tests."""

from __future__ import annotations

import pytest
from django.tasks import task_backends

from chasqui_core import access
from dashboard.sampler import get_sampler


@pytest.fixture(autouse=True)
def _fresh_state(redis):
    """Flushed Redis (via ``redis``), new backend clients, and a sampler without cached history."""
    for backend in task_backends.all():
        backend.reset_connections()
    sampler = get_sampler()
    sampler._reader = None
    yield
    sampler._reader = None


def _user(django_user_model, username: str, group: str | None):
    access.ensure_groups()
    user = django_user_model.objects.create_user(username=username, password=f"{username}-password")
    if group is not None:
        from django.contrib.auth.models import Group

        user.groups.add(Group.objects.get(name=group))
    return django_user_model.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def operator(db, django_user_model):
    """Every Chasqui permission."""
    return _user(django_user_model, "olga", access.OPERATORS)


@pytest.fixture
def viewer(db, django_user_model):
    """view_queues only: sees everything, changes nothing."""
    return _user(django_user_model, "vera", access.VIEWERS)


@pytest.fixture
def outsider(db, django_user_model):
    """Logged in, but without any Chasqui permission."""
    return _user(django_user_model, "otto", None)


@pytest.fixture
def viewer_cookie(viewer) -> bytes:
    """A browser session of the viewer, for websockets."""
    from tests.dashboard.websockets import session_cookie

    return session_cookie(viewer)


@pytest.fixture
def outsider_cookie(outsider) -> bytes:
    from tests.dashboard.websockets import session_cookie

    return session_cookie(outsider)
