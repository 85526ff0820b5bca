import os

import pytest
import redis as redis_lib


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


@pytest.fixture
def redis(redis_url):
    """A client on a clean keyspace (the database is flushed before the test)."""
    client = redis_lib.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()
