"""settle.lua's contract with the settler: the arguments ``settle_call`` builds are the ones the script reads,
and ``SettleReply`` names what it returns. One batch of every kind of outcome, run on a real server."""

from __future__ import annotations

import pytest

from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.jobs.envelope import Job, decode, new_job_id, now_ms
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler, SettleReply, settle_call

WORKER = "w-settle"


@pytest.mark.asyncio
async def test_one_call_settles_each_kind_of_outcome_and_its_reply_says_what_it_did(redis, redis_url):
    keys = QueueKeys.for_queue("settle-contract")
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    jobs = [Job(id=new_job_id(), task="t.task", created_at=now_ms()) for _ in range(5)]
    for job in jobs:
        redis.xadd(keys.stream, {"j": job.encode()})
    [[_, read]] = redis.xreadgroup(GROUP, WORKER, {keys.stream: ">"})
    ids = [entry_id for entry_id, _ in read]
    redis.hset(keys.running(WORKER), mapping={i: now_ms() for i in ids})  # every run marked in the journal

    client = aconnect(redis_url)
    settler = Settler(client, Scripts(client), worker_id=WORKER)
    ok, retried, dead, requeued, skipped = zip(ids, jobs, strict=True)
    settler.complete(keys, ok[0], ok[1].id, "t.task", 3, marker=(keys.done + "k-ok", 60_000))
    settler.retry(keys, retried[0], 60_000, retried[1].encode(), job_id=retried[1].id, task="t.task", attempt=1,
                  error_class="ValueError", error="boom", duration_ms=4)
    settler.dead(keys, dead[0], dead[1].encode(), "retries_exhausted", job_id=dead[1].id, task="t.task",
                 error_class="ValueError", error="boom for good", handler_failed=True, duration_ms=5)
    settler.requeue(keys, requeued[0], requeued[1].encode())
    settler.skip(keys, skipped[0], skipped[1].id, "t.task", "k-ok", ok[1].id)
    settler.fetched(keys, 5)
    batch = settler._batches[keys.stream]
    assert sorted(batch.entry_ids()) == sorted(ids), "every outcome's entry id is read back from its record"

    reply = SettleReply.of(await Scripts(client).settle(**settle_call(keys, WORKER, batch)))
    await client.aclose()
    assert (reply.completed, reply.retried, reply.dead, reply.requeued, reply.skipped) == (1, 1, 1, 1, 1)
    assert reply.problems == []
    assert 59_000 <= reply.earliest_retry_ms - reply.server_ms <= 60_000

    assert redis.xpending(keys.stream, GROUP)["pending"] == 0, "every entry acknowledged"
    assert redis.hlen(keys.running(WORKER)) == 0, "every settled entry's journal mark struck"
    [(member, _)] = redis.zrange(keys.delayed, 0, -1, withscores=True)
    assert decode(member).id == retried[1].id
    [(_, dead_fields)] = redis.xrange(keys.dlq)
    assert dead_fields[b"reason"] == b"retries_exhausted" and decode(dead_fields[b"j"]).id == dead[1].id
    back = [decode(fields[b"j"]).id for _, fields in redis.xrange(keys.stream)]
    assert back == [requeued[1].id], "only the requeued job is on the stream again, as a new entry"
    assert redis.get(keys.done + "k-ok") == ok[1].id.encode()
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.metrics + "total").items()}
    assert totals["fetched"] == 5 and totals["completed"] == 1 and totals["dlq"] == 1
    assert totals["dlq:retries_exhausted"] == 1 and totals["skipped"] == 1


@pytest.mark.asyncio
async def test_a_late_failure_never_overwrites_the_result_a_later_run_stored(redis, redis_url):
    """A worker cut off past its lease settles late: the entry was taken back, ran elsewhere and succeeded. Its
    retry (or death) is not applied, its entry no longer pending; its result record (READY, FAILED) must not be
    either, or ``get_result()`` would say the job is still waiting after it succeeded (the soak met this under
    network faults). A success's result is stored whatever the entry's state: that run did succeed."""
    keys = QueueKeys.for_queue("settle-late")
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    jobs = [Job(id=new_job_id(), task="t.task", created_at=now_ms()) for _ in range(3)]
    for job in jobs:
        redis.xadd(keys.stream, {"j": job.encode()})
    [[_, read]] = redis.xreadgroup(GROUP, WORKER, {keys.stream: ">"})
    ids = [entry_id for entry_id, _ in read]
    redis.xack(keys.stream, GROUP, *ids)  # settled by the run that took over; these outcomes come too late
    for job in jobs:
        redis.set(keys.result + job.id, b"SUCCESSFUL elsewhere")

    client = aconnect(redis_url)
    settler = Settler(client, Scripts(client), worker_id=WORKER)
    settler.retry(keys, ids[0], 1000, jobs[0].encode(), job_id=jobs[0].id, task="t.task", attempt=1,
                  error_class="ValueError", error="late", duration_ms=1,
                  result=(keys.result + jobs[0].id, 60_000, b"READY late"))
    settler.dead(keys, ids[1], jobs[1].encode(), "retries_exhausted", job_id=jobs[1].id, task="t.task",
                 error_class="ValueError", error="late", result=(keys.result + jobs[1].id, 60_000, b"FAILED late"))
    settler.complete(keys, ids[2], jobs[2].id, "t.task", 1, result=(keys.result + jobs[2].id, 60_000, b"ok late"))
    reply = SettleReply.of(await Scripts(client).settle(**settle_call(keys, WORKER, settler._batches[keys.stream])))
    await client.aclose()
    assert (reply.retried, reply.dead) == (0, 0) and reply.problems == []
    assert redis.get(keys.result + jobs[0].id) == b"SUCCESSFUL elsewhere"
    assert redis.get(keys.result + jobs[1].id) == b"SUCCESSFUL elsewhere"
    assert redis.get(keys.result + jobs[2].id) == b"ok late"
    assert redis.zcard(keys.delayed) == 0 and redis.xlen(keys.dlq) == 0
