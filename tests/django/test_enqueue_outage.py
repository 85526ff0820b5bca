"""enqueue() while Redis is down: retried for CHASQUI["ENQUEUE_RETRY_SECONDS"], then one clear error."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from chasqui_core.conf import load
from chasqui_core.engine.store.embedded import EmbeddedValkey
from chasqui_core.engine.jobs.errors import EnqueueUnavailable

from . import sample_tasks


@pytest.mark.parametrize("value", [-1, "5", True, 10_000])
def test_a_bad_retry_window_is_refused_at_start_up(value):
    with pytest.raises(ImproperlyConfigured, match="ENQUEUE_RETRY_SECONDS"):
        load({"ENQUEUE_RETRY_SECONDS": value})


def test_enqueue_against_a_server_that_stays_down_raises_our_error(settings, tmp_path):
    with EmbeddedValkey(tmp_path / "valkey", appendonly=False) as server:
        settings.CHASQUI = {"REDIS_URL": server.url, "ENQUEUE_RETRY_SECONDS": 0.5}
        sample_tasks.add.enqueue(1, 1)
        server.stop()
        with pytest.raises(EnqueueUnavailable) as caught:
            sample_tasks.add.enqueue(2, 2)
    message = str(caught.value)
    assert f"127.0.0.1:{server.port}" in message and "0.5s" in message
    assert "Nothing was added" in message


def test_the_retry_window_reaches_the_backend_queues(settings):
    settings.CHASQUI = {"ENQUEUE_RETRY_SECONDS": 2.5}
    from django.tasks import task_backends

    assert task_backends["default"].queue("default").retry_for == 2.5


def test_enqueue_cut_off_by_a_blackhole_gives_up_within_the_retry_window(settings, tmp_path):
    import time

    from bench.faultproxy import FaultProxy

    with EmbeddedValkey(tmp_path / "valkey", appendonly=False) as server, FaultProxy(server.port) as proxy:
        settings.CHASQUI = {"REDIS_URL": proxy.url, "ENQUEUE_RETRY_SECONDS": 2}
        sample_tasks.add.enqueue(1, 1)  # the backend's client and link are up when the network goes silent
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(EnqueueUnavailable):
            sample_tasks.add.enqueue(2, 2)
        took = time.monotonic() - started
        proxy.heal()
    # the window is 2 s; a silent server used to hold the first try for the socket's timeout (5 s) before it
    assert 1.9 <= took < 4.5, took
