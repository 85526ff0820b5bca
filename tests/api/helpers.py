"""API clients, and queue state built the way the engine writes it, for the API and CLI tests.

Dead-letter entries come from tests/helpers.py, shared with the console's tests.
"""

from __future__ import annotations

import json
import time

import msgpack
import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client

from chasqui_core.engine.jobs.envelope import Job, decode
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.models import ApiKey
from tests.api.conformance import check_response
from tests.helpers import TASK, add_dead, bulk_dead


class ApiClient:
    """A Django test client that sends JSON and an optional bearer key, and checks every answer
    against the API's published schema."""

    def __init__(self, key: str | None = None, client: Client | None = None) -> None:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self.client = client or Client(headers=headers)
        self.key = key

    def get(self, path: str, **params):
        response = self.client.get(path, params)
        check_response("GET", path, response)
        return response

    def post(self, path: str, body=None, **extra):
        data = json.dumps(body) if body is not None else ""
        response = self.client.post(path, data=data, content_type="application/json", **extra)
        check_response("POST", path, response)
        return response


def key_client(user) -> ApiClient:
    """An ApiClient sending a new API key of ``user``."""
    _, key = ApiKey.issue(user, name="tests")
    return ApiClient(key)


def stream_jobs(redis, queue: str) -> list[Job]:
    return [decode(fields[b"j"]) for _, fields in redis.xrange(QueueKeys.for_queue(queue).stream)]


def dlq_len(redis, queue: str) -> int:
    return int(redis.xlen(QueueKeys.for_queue(queue).dlq))


def add_delayed(redis, queue: str, *, delay_ms: int = 3_600_000, task=TASK, args=(1, 2), kwargs=None) -> str:
    return Queue(queue, redis_client=redis).add(task, list(args), kwargs or {}, delay=delay_ms).job_id


def server_ms(redis) -> int:
    seconds, micros = redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def heartbeat(redis, queues, worker_id: str, *, age_ms: int = 0, in_flight: int = 0, processed: int = 0,
              current=(), rss_kb: int = 0, supervisor: int | None = None) -> None:
    """Write a heartbeat as a worker does; ``current`` holds (task, job id, started at ms) triples."""
    info = msgpack.packb({
        "id": worker_id, "host": "box-1", "pid": 4242, "queues": list(queues), "concurrency": 8,
        "in_flight": in_flight, "processed": processed, "failed": 1,
        "started_at": server_ms(redis) - 60_000, "last_seen": server_ms(redis) - age_ms,
        "current": [list(job) for job in current], "rss_kb": rss_kb, "supervisor": supervisor,
    })
    for q in queues:
        redis.sadd(QUEUES_REGISTRY, q)
        redis.hset(QueueKeys.for_queue(q).workers, worker_id, info)


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


@pytest.fixture(autouse=True)
def keep_test_connection():
    """Like Django's test client: requests must not close the test's database connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def seeded_operator_key(operator, redis):
    """An operator's API key, with something to find on queue ``default`` (dead, delayed, a worker), so generated
    requests reach past "unknown queue"."""
    bulk_dead(redis, "default", 5)
    add_dead(redis, "default", kwargs={"password": "x"}, reason="unrecoverable")
    add_delayed(redis, "default")
    heartbeat(redis, ["default"], "w-fuzz")
    _, key = ApiKey.issue(operator)
    return key
