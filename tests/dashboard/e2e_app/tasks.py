"""Two tasks a browser test can steer from outside the worker process.

``charge`` fails while the Redis key GATEWAY_DOWN exists, like a payment
gateway that is down and later comes back: its jobs retry, die, and succeed
once replayed after the key is gone. ``render_invoice`` always fails, for
the dead letters a test discards.
"""

from __future__ import annotations

import os

from django.tasks import task

from chasqui_core.engine.store.connection import connect
from tests.dashboard.e2e_app import GATEWAY_DOWN, QUEUE

_client = None


def _redis():
    global _client
    if _client is None:
        _client = connect(os.environ["REDIS_URL"])  # a cluster's client too
    return _client


@task(queue_name=QUEUE, max_attempts=3, backoff=1200)
def charge(order: int) -> str:
    if _redis().exists(GATEWAY_DOWN):
        raise ConnectionError(f"payment gateway timed out for order {order}")
    return f"order {order} charged"


@task(queue_name=QUEUE, max_attempts=1)
def render_invoice(order: int) -> str:
    raise ValueError(f"invoice template missing for order {order}")
