"""Admission, what becomes of each entry a worker reads, against a real server: the entries are written and read
with XREADGROUP as a worker reads them, and what admission refuses is found in the dead-letter queue with the
reason an operator reads there."""

from __future__ import annotations

import pytest

from chasqui_core.engine.worker.admission import Admission
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.worker.delivery import ref_of
from chasqui_core.engine.jobs.envelope import Job, new_job_id, now_ms
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RetryPolicy
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.jobs.signing import Signer

QUEUE = "admit"


def envelope(task: str = "t.ok", **fields) -> bytes:
    """An envelope as a producer (or a retry, with ``attempt``) writes it."""
    return Job(id=new_job_id(), task=task, created_at=now_ms(), **fields).encode()


def read(redis, *fields_list: dict) -> list:
    """Write entries to the queue's stream and read them as a worker does (raw fields lists, as the reader gets)."""
    keys = QueueKeys.for_queue(QUEUE)
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    for fields in fields_list:
        redis.xadd(keys.stream, fields)
    [[_, entries]] = redis.xreadgroup(GROUP, "w-admit", {keys.stream: ">"})
    return [(entry_id, [x for pair in fields.items() for x in pair]) for entry_id, fields in entries]


async def admitted(redis_url, entries, *, max_payload_bytes=10_000, signer=None, held=None):
    client = aconnect(redis_url)
    settler = Settler(client, Scripts(client), worker_id="w-admit")
    registry = HandlerRegistry()
    registry.register("t.ok", lambda: None)
    held = held if held is not None else InFlight()
    admission = Admission(registry, Outcomes(settler, RetryPolicy(), "w-admit"), RetryPolicy(), held,
                          signer=signer, max_payload_bytes=max_payload_bytes, default_timeout=None)
    deliveries = admission.admit(QueueKeys.for_queue(QUEUE), entries)
    await settler.flush()
    await client.aclose()
    return deliveries, held, admission


def dead_reasons(redis) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in redis.xrange(QueueKeys.for_queue(QUEUE).dlq)]


@pytest.mark.asyncio
async def test_a_well_formed_entry_becomes_a_held_delivery_named_by_its_stream_and_entry_id(redis, redis_url):
    entries = read(redis, {"j": envelope(args=[1, 2])})
    [d], held, _ = await admitted(redis_url, entries)
    keys = QueueKeys.for_queue(QUEUE)
    assert d.ref == ref_of(keys.stream, entries[0][0]) and held.holds(d) and len(held) == 1
    assert d.job.task == "t.ok" and d.job.args == [1, 2] and d.max_attempts == 3
    assert dead_reasons(redis) == []


@pytest.mark.asyncio
async def test_what_cannot_run_is_refused_with_its_reason_and_the_rest_of_the_batch_goes_on(redis, redis_url):
    entries = read(redis,
                   {"j": b"\x93not an envelope"},
                   {"j": envelope(args=["x" * 2_000])},
                   {"j": envelope("t.unknown")},
                   {"other": b"field"},
                   {"j": envelope(max_attempts=2, attempt=2)},
                   {"j": envelope()})
    deliveries, held, _ = await admitted(redis_url, entries, max_payload_bytes=1_000)
    assert [d.job.task for d in deliveries] == ["t.ok"] and len(held) == 1
    assert dead_reasons(redis) == ["decode_failed", "oversize", "unknown_task", "decode_failed", "invalid"]


@pytest.mark.asyncio
async def test_an_entry_read_again_while_held_is_counted_and_the_held_delivery_goes_on(redis, redis_url):
    entries = read(redis, {"j": envelope()})
    [first], held, _ = await admitted(redis_url, entries)
    again, held, admission = await admitted(redis_url, entries, held=held)
    assert again == [] and held.holds(first) and admission.skipped == 1
    assert dead_reasons(redis) == []


@pytest.mark.asyncio
async def test_with_signing_keys_an_unsigned_job_is_refused_before_its_task_is_looked_up(redis, redis_url):
    entries = read(redis, {"j": envelope("t.unknown")})
    deliveries, held, _ = await admitted(redis_url, entries, signer=Signer(["k" * 32]))
    assert deliveries == [] and len(held) == 0
    assert dead_reasons(redis) == ["bad_signature"]
