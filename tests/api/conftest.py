"""Users of each kind, API clients for them, and a clean Redis per test."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User
from django.tasks import task_backends
from django.test import Client

from chasqui_core import access
from chasqui_core.models import ApiKey
from tests.api.conformance import check_response
from tests.django import sample_tasks  # noqa: F401  (registers the sample tasks)


@pytest.fixture(autouse=True)
def _fresh_backend(redis):
    """Each test gets a flushed Redis, a backend client connected to it, and no failed-key counts."""
    from django.core.cache import cache

    for backend in task_backends.all():
        backend.reset_connections()
    cache.clear()
    yield


class ApiClient:
    """A Django test client that sends JSON and an optional bearer key, and checks every answer
    against the API's published schema."""

    def __init__(self, key: str | None = None, client: Client | None = None) -> None:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self.client = client or Client(headers=headers)
        self.key = key

    def get(self, path: str, **params):
        response = self.client.get(path, params)
        check_response("GET", path, response)
        return response

    def post(self, path: str, body=None, **extra):
        data = json.dumps(body) if body is not None else ""
        response = self.client.post(path, data=data, content_type="application/json", **extra)
        check_response("POST", path, response)
        return response


def make_user(name: str, group: str | None = None, **kw) -> User:
    user = User.objects.create_user(name, password="pw-" + name, **kw)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def groups(db):
    # Transactional tests flush the database, groups included.
    access.ensure_groups()


@pytest.fixture
def operator(groups) -> User:
    return make_user("olga", access.OPERATORS)


@pytest.fixture
def viewer(groups) -> User:
    return make_user("victor", access.VIEWERS)


@pytest.fixture
def nobody(groups) -> User:
    return make_user("nadia")


def key_client(user: User) -> ApiClient:
    _, key = ApiKey.issue(user, name="tests")
    return ApiClient(key)


@pytest.fixture
def op_api(operator) -> ApiClient:
    return key_client(operator)


@pytest.fixture
def view_api(viewer) -> ApiClient:
    return key_client(viewer)


@pytest.fixture
def nobody_api(nobody) -> ApiClient:
    return key_client(nobody)


@pytest.fixture
def anon_api(db) -> ApiClient:
    return ApiClient()
