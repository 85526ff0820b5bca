"""Tasks whose runs the tests can follow from outside the worker processes: which process, when."""

from __future__ import annotations

import asyncio
import os
import time

from django.tasks import task

from chasqui_core.engine.store.connection import connect
from tests.supervisor.app import DONE, HANG_TIMEOUT, HUNG, QUEUE, STARTED, TICKS

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


@task(queue_name=QUEUE)
def tick(key: str) -> None:
    _redis().rpush(TICKS, f"{key}:{os.getpid()}:{time.time()}")


@task(queue_name=QUEUE, timeout=HANG_TIMEOUT, max_attempts=1)
def hang() -> None:
    _redis().rpush(HUNG, os.getpid())
    time.sleep(600)  # its thread cannot be stopped; the process exits without it


@task(queue_name=QUEUE)
def doze(key: str, seconds: float) -> None:
    time.sleep(seconds)
    _redis().rpush(DONE, f"{key}:{os.getpid()}")


@task(queue_name=QUEUE, max_attempts=10)
def pill() -> None:
    _redis().rpush(STARTED, f"pill:{os.getpid()}")
    os._exit(1)
