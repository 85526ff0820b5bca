"""Fixtures every test folder shares: a Redis of the tests' own, a clean backend, users with each level of access.

Builders of queue contents (dead-letter entries...) are in tests/helpers.py.
"""

import os
from urllib.parse import urlsplit

import pytest
import redis as redis_lib

from chasqui_core.engine.store.connection import connect, is_cluster_client

OWNED_MARK = "chasqui-tests:owned"
"""Written after every flush: the database is the tests' own, so a later run may flush it again."""


def connect_tests(url: str):
    """A client of the tests' server: plain, or redis-py's cluster client when the URL names a cluster node."""
    return connect(url, socket_connect_timeout=2)


def flush(client) -> None:
    """Empty the tests' database: FLUSHDB, on every master of a cluster."""
    if is_cluster_client(client):
        client.flushdb(target_nodes=client.PRIMARIES)
    else:
        client.flushdb()


def _key_count(client) -> int:
    if is_cluster_client(client):
        return int(client.dbsize(target_nodes=client.PRIMARIES))
    return int(client.dbsize())


def pytest_configure(config):
    """Refuse a ``REDIS_URL`` database holding data the tests did not write: they flush it before each test."""
    url = os.environ["REDIS_URL"]
    try:
        client = connect_tests(url)
        foreign = _key_count(client) and not client.exists(OWNED_MARK)
    except redis_lib.RedisError:
        return  # unreachable: the tests that need it say so
    client.close()
    if foreign:
        db = urlsplit(url).path.strip("/") or "0"
        raise pytest.UsageError(
            f"REDIS_URL points at database {db}, which holds data the tests did not write. The tests empty "
            "their database (FLUSHDB) before each test, so they only run on a server or database of their own: "
            "unset REDIS_URL (they start a private Valkey) or point it at an empty database."
        )


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


@pytest.fixture
def redis(redis_url):
    """A client on a clean keyspace (the database is flushed before the test; every master of a cluster)."""
    client = connect_tests(redis_url)
    flush(client)
    client.set(OWNED_MARK, "flushed by the Chasqui test suite")
    yield client
    client.close()


@pytest.fixture
def fresh_backend(redis):
    """A flushed Redis (the project's cache and channel layer live in it too) and task backends connected anew."""
    from django.tasks import task_backends

    for backend in task_backends.all():
        backend.reset_connections()
    yield


# --- users with each level of access ----------------------------------------------------------------------


def _user(django_user_model, username: str, group: str | None):
    """A user whose password is ``<username>-password``, in ``group`` (one of chasqui_core.access's groups)."""
    from django.contrib.auth.models import Group

    from chasqui_core import access

    access.ensure_groups()  # transactional tests empty the database, groups included
    user = django_user_model.objects.create_user(username=username, password=f"{username}-password")
    if group is not None:
        user.groups.add(Group.objects.get(name=group))
    return django_user_model.objects.get(pk=user.pk)  # a fresh permission cache


@pytest.fixture
def operator(db, django_user_model):
    """Every Chasqui permission."""
    from chasqui_core import access

    return _user(django_user_model, "olga", access.OPERATORS)


@pytest.fixture
def viewer(db, django_user_model):
    """view_queues only: sees everything, changes nothing."""
    from chasqui_core import access

    return _user(django_user_model, "vera", access.VIEWERS)


@pytest.fixture
def outsider(db, django_user_model):
    """Logged in, but without any Chasqui permission."""
    return _user(django_user_model, "otto", None)
