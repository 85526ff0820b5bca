"""The engine behind Sentinel: a ``redis+sentinel://`` URL, and a failover the producer and the worker follow.

The master, its replica and the Sentinel are started from the machine's
``redis-server`` (``--sentinel``), by tests/clusters.py.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from chasqui_core.engine.store.connection import SentinelURL, connect
from chasqui_core.engine.jobs.errors import RedisConfigError
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.worker.worker import Worker
from tests.clusters import SentinelGroup
from tests.engine.worker_app import wait_for


@pytest.mark.timeout(120)
def test_producer_and_worker_follow_the_master_sentinel_names(tmp_path):
    group = SentinelGroup(tmp_path / "sentinel")
    url = group.start()
    try:
        runs: Counter[str] = Counter()
        registry = HandlerRegistry()
        registry.register("record", lambda tag: runs.update([tag]))
        worker = Worker(["watched"], registry, url=url, install_signal_handlers=False, block_ms=200,
                        heartbeat_interval=0.2)
        thread = threading.Thread(target=worker.run_sync, daemon=True)
        thread.start()
        queue = Queue("watched", url=url, retry_for=60)
        try:
            queue.add_bulk([JobSpec("record", [f"before-{i}"]) for i in range(20)])
            wait_for(lambda: len(runs) == 20, 30, "the jobs added before the failover")
            first = group.master()
            group.failover()
            wait_for(lambda: group.master() != first, 30, "the Sentinel to name the replica master")
            after = [queue.add("record", [f"after-{i}"]) for i in range(20)]
            assert all(e.entry_id for e in after)
            queue.add("record", ["delayed-after"], delay=200)
            wanted = {f"after-{i}" for i in range(20)} | {"delayed-after"}
            wait_for(lambda: wanted <= set(runs), 60, "the worker to run the jobs added to the new master")
            client = connect(url)
            assert client.connection_pool.get_master_address()[1] == group.master()[1]
            client.close()
        finally:
            worker.request_stop()
            thread.join(30)
            queue.close()
        assert not thread.is_alive()
    finally:
        group.stop()


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    spec = SentinelURL.parse("redis+sentinel://app:pw@10.0.0.1:26379,10.0.0.2:26380/jobs/2"
                             "?sentinel_password=sp&socket_timeout=3")
    assert spec.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (spec.service, spec.db, spec.tls) == ("jobs", 2, False)
    assert spec.options == {"username": "app", "password": "pw", "socket_timeout": 3.0}
    assert spec.sentinel_options == {"password": "sp"}
    assert SentinelURL.parse("rediss+sentinel://h:1/jobs").tls


@pytest.mark.parametrize("url", ["redis+sentinel://h:1", "redis+sentinel://h/jobs", "redis+sentinel://h:1/a/b/c"])
def test_a_malformed_sentinel_url_is_refused_naming_what_to_write(url):
    with pytest.raises(RedisConfigError, match="Sentinel"):
        SentinelURL.parse(url)
