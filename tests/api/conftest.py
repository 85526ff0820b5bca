"""API clients for the users of tests/conftest.py, and a clean Redis per test."""

from __future__ import annotations

import pytest

from tests.django import sample_tasks  # noqa: F401  (registers the sample tasks)

from .helpers import ApiClient, key_client


@pytest.fixture(autouse=True)
def _fresh(fresh_backend):
    """Each test gets a flushed Redis (no failed-key counts either: they are in its cache) and new backend clients."""


@pytest.fixture
def op_api(operator) -> ApiClient:
    return key_client(operator)


@pytest.fixture
def view_api(viewer) -> ApiClient:
    return key_client(viewer)


@pytest.fixture
def outsider_api(outsider) -> ApiClient:
    return key_client(outsider)


@pytest.fixture
def anon_api(db) -> ApiClient:
    return ApiClient()
