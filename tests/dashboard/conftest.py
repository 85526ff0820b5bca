"""Fixtures of the console tests: a clean Redis and console state per test, and browser sessions for websockets.

The users (operator, viewer, outsider) come from tests/conftest.py.
"""

from __future__ import annotations

import pytest

from dashboard.sampler import get_sampler


@pytest.fixture(autouse=True)
def _fresh_state(fresh_backend):
    """A flushed Redis, new backend clients, and a sampler without cached history."""
    sampler = get_sampler()
    sampler._reader = None
    yield
    sampler._reader = None


@pytest.fixture
def viewer_cookie(viewer) -> bytes:
    """A browser session of the viewer, for websockets."""
    from tests.dashboard.websockets import session_cookie

    return session_cookie(viewer)


@pytest.fixture
def outsider_cookie(outsider) -> bytes:
    from tests.dashboard.websockets import session_cookie

    return session_cookie(outsider)
