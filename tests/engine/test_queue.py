"""The producer's bulk send: one round trip per chunk, with the caller's work done while the server runs it."""

from __future__ import annotations

import pytest

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue


def _stream_ids(redis, queue: str) -> list[str]:
    return [decode(fields[b"j"]).id for _, fields in redis.xrange(QueueKeys.for_queue(queue).stream)]


def test_meanwhile_sees_each_chunk_in_order_once_it_is_sent(redis):
    queue = Queue("meanwhile", redis_client=redis, chunk_size=4)
    built = [queue.build(JobSpec("t", [i])) for i in range(10)]
    seen: list[tuple[list[str], int]] = []

    def meanwhile(chunk):
        # the chunk is on its way: at most the jobs up to the end of this chunk can be in the stream
        seen.append(([job.job_id for job in chunk], redis.xlen(QueueKeys.for_queue("meanwhile").stream)))

    added = queue.add_built_many(built, meanwhile=meanwhile)

    assert [ids for ids, _ in seen] == [[b.job_id for b in built[s:s + 4]] for s in (0, 4, 8)]
    assert all(length <= 4 * (n + 1) for n, (_, length) in enumerate(seen))
    assert [a.job_id for a in added] == [b.job_id for b in built]
    assert _stream_ids(redis, "meanwhile") == [b.job_id for b in built]


def test_an_error_in_meanwhile_sees_the_sent_chunk_through_and_sends_no_more(redis):
    queue = Queue("meanwhile-error", redis_client=redis, chunk_size=4)
    built = [queue.build(JobSpec("t", [i])) for i in range(10)]

    def meanwhile(chunk):
        if chunk[0] is built[4]:
            raise RuntimeError("the caller's bookkeeping failed")

    with pytest.raises(RuntimeError, match="bookkeeping"):
        queue.add_built_many(built, meanwhile=meanwhile)

    # the first two chunks were sent before the error: they are in, whole; the third never left
    assert _stream_ids(redis, "meanwhile-error") == [b.job_id for b in built[:8]]
