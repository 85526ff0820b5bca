"""Fixtures of the engine tests that run real worker processes."""

import pytest

from tests.engine.worker_app import Workers


@pytest.fixture
def workers(redis, redis_url, tmp_path):
    """Starts worker processes (tests/engine/worker_app.py) and stops every one at the end."""
    procs = Workers(redis_url, tmp_path)
    yield procs
    procs.close()
