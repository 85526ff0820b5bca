"""One task whose runs the tests can follow from outside the worker processes: which process, when."""

from __future__ import annotations

import asyncio
import os

from django.tasks import task

from chasqui_core.engine.connection import connect
from tests.supervisor.app import DONE, QUEUE, STARTED

_client = None


def _redis():
    global _client
    if _client is None:
        _client = connect(os.environ["REDIS_URL"])  # a cluster's client too
    return _client


@task(queue_name=QUEUE)
async def nap(key: str, seconds: float) -> None:
    _redis().rpush(STARTED, f"{key}:{os.getpid()}")
    await asyncio.sleep(seconds)
    _redis().rpush(DONE, f"{key}:{os.getpid()}")
