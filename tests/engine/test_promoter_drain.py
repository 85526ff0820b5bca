"""The promoter drains a backlog bigger than a batch with two calls in flight: every job moves exactly once."""

from __future__ import annotations

import asyncio
import time

from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.timing.promoter import Promoter
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.store.scripts import Scripts
from datetime import UTC

KEYS = QueueKeys.for_queue("drain")


def test_a_backlog_of_many_batches_moves_every_job_once(redis, redis_url):
    due = time.time() - 1
    from datetime import datetime

    added = Queue("drain", redis_client=redis).add_bulk(
        JobSpec("tasks.x", [i], run_at=datetime.fromtimestamp(due, UTC)) for i in range(2_550))
    redis.zadd(KEYS.delayed, {b"later": time.time() * 1000 + 3_600_000})  # not due: must stay

    async def run() -> Promoter:
        client = aconnect(redis_url)
        promoter = Promoter(client, Scripts(client), KEYS, "drain-test", batch_size=100)
        stop = asyncio.Event()

        async def until_moved() -> None:
            while promoter.moved_total < len(added):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # a second drain would show now
            stop.set()

        await asyncio.wait_for(asyncio.gather(promoter.run(stop), until_moved()), timeout=30)
        await client.aclose()
        return promoter

    promoter = asyncio.run(run())
    ids = [decode(fields[b"j"]).id for _, fields in redis.xrange(KEYS.stream)]
    assert sorted(ids) == sorted(e.job_id for e in added)
    assert promoter.moved_total == len(added)
    assert redis.zrange(KEYS.delayed, 0, -1) == [b"later"]
