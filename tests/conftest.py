import os

import pytest
import redis as redis_lib

OWNED_MARK = "chasqui-tests:owned"
"""Written after every flush: the database is the tests' own, so a later run may flush it again."""


def pytest_configure(config):
    """Refuse a ``REDIS_URL`` database holding data the tests did not write: they flush it before each test."""
    url = os.environ["REDIS_URL"]
    client = redis_lib.Redis.from_url(url, socket_connect_timeout=2)
    try:
        foreign = client.dbsize() and not client.exists(OWNED_MARK)
    except redis_lib.RedisError:
        return  # unreachable: the tests that need it say so
    finally:
        client.close()
    if foreign:
        db = client.connection_pool.connection_kwargs.get("db", 0)
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
    """A client on a clean keyspace (the database is flushed before the test)."""
    client = redis_lib.Redis.from_url(redis_url)
    client.flushdb()
    client.set(OWNED_MARK, "flushed by the Chasqui test suite")
    yield client
    client.close()
