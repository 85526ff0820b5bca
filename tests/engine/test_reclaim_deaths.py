"""A reclaim pass looks for dead neighbours just before each queue's streams, not once for the whole pass.

A pass over many streams on a slow link takes seconds. A worker of this host
whose process died after a single look at the start of the pass, and whose
alive key lapsed before its stream's turn, had its run charged as lost
contact, not as a death: the soak met a poison pill that killed a third
process that way (200 ms of latency just after a Redis restart).
"""

from __future__ import annotations

import subprocess
import sys
import time
import types

import msgpack

from chasqui_core.engine.jobs.envelope import Job, new_job_id, now_ms
from chasqui_core.engine.recovery.deathwatch import SPACE_FIELD, note_clean_stop, process_space
from chasqui_core.engine.recovery.ended_runs import EndedRuns
from chasqui_core.engine.recovery.reclaim import LOST_FIELD, lost_runs
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.worker import housekeeping
from chasqui_core.engine.worker.housekeeping import Housekeeping

FIRST, SECOND = QueueKeys.for_queue("reclaim-first"), QueueKeys.for_queue("reclaim-second")
VISIBILITY_MS = 100


async def test_a_neighbour_that_dies_while_a_pass_is_under_way_is_charged_a_death_on_a_later_queue(
        redis, redis_url, monkeypatch):
    for keys in (FIRST, SECOND):
        redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    # a neighbour on SECOND, alive when the pass begins, running a job; its alive key has lapsed (a slow link)
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        dead_id = f"vm:{neighbour.pid}:dead"
        redis.hset(SECOND.workers, dead_id, msgpack.packb({"id": dead_id, "pid": neighbour.pid,
                                                           "started_at": now_ms(), SPACE_FIELD: process_space()}))
        redis.xadd(SECOND.stream, {"j": Job(new_job_id(), "t", [], {}, created_at=now_ms()).encode()})
        [[_, [(entry_id, _)]]] = redis.xreadgroup(GROUP, dead_id, {SECOND.stream: ">"})
        redis.hset(SECOND.running(dead_id), entry_id, now_ms())
        time.sleep(2 * VISIBILITY_MS / 1000)

        real = housekeeping.reclaim_abandoned

        async def reclaim(scripts, keys, consumer, **kw):
            if keys.queue == FIRST.queue and neighbour.poll() is None:
                neighbour.kill()  # it dies while the pass is on the first queue
                neighbour.wait()
            return await real(scripts, keys, consumer, **kw)

        monkeypatch.setattr(housekeeping, "reclaim_abandoned", reclaim)
        client = aconnect(redis_url)
        host = types.SimpleNamespace(id="vm:reclaimer:1", keys=[FIRST, SECOND], client=client,
                                     streams={FIRST.queue: [FIRST], SECOND.queue: [SECOND]},
                                     paused={FIRST.queue: False, SECOND.queue: False}, scripts=Scripts(client),
                                     visibility_timeout_ms=VISIBILITY_MS, all_streams=lambda: [FIRST, SECOND])
        try:
            await Housekeeping(host).reclaim()
        finally:
            await client.aclose()
    finally:
        neighbour.kill()
        neighbour.wait()
    [(_, fields)] = redis.xrange(SECOND.stream)
    [run] = lost_runs(fields[LOST_FIELD])
    assert run.died, "its process was gone when its queue's turn came: a death, not lost contact"
    assert redis.exists(SECOND.died(dead_id))


async def test_the_unsent_ends_of_a_worker_that_stopped_cleanly_out_of_reach_are_struck_before_its_reclaim(
        redis, redis_url):
    """A worker that stops while the network refuses it records its end first (announce_stop: runs under way
    then would be lost with it), then its last run ends, and neither its outcome nor the strike of its start mark
    reaches Redis; it leaves the note of a clean stop and its ended runs on the host. Once its process is gone, a
    worker beside it strikes those marks before it reclaims the queue: the run had returned, and is put back
    uncharged, not charged a death (the soak met a job dead-lettered `WorkerLost` that way)."""
    redis.xgroup_create(SECOND.stream, GROUP, id="0", mkstream=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stopped_id = f"vm:{gone.pid}:stopped"
    redis.hset(SECOND.workers, stopped_id, msgpack.packb({"id": stopped_id, "pid": gone.pid,
                                                          "started_at": now_ms() - 60_000,
                                                          SPACE_FIELD: process_space()}))
    redis.xadd(SECOND.stream, {"j": Job(new_job_id(), "t", [], {}, created_at=now_ms()).encode()})
    [[_, [(entry_id, _)]]] = redis.xreadgroup(GROUP, stopped_id, {SECOND.stream: ">"})
    redis.hset(SECOND.running(stopped_id), entry_id, now_ms())
    redis.set(SECOND.died(stopped_id), f"{now_ms()} stopping with 1 run(s) under way")
    ends = EndedRuns(stopped_id)
    ends.ended(ends.name(SECOND.running(stopped_id)), entry_id)
    ends.close(keep=True)
    note_clean_stop(stopped_id)
    time.sleep(2 * VISIBILITY_MS / 1000)
    client = aconnect(redis_url)
    host = types.SimpleNamespace(id="vm:reclaimer:2", keys=[SECOND], client=client, streams={SECOND.queue: [SECOND]},
                                 paused={SECOND.queue: False}, scripts=Scripts(client),
                                 visibility_timeout_ms=VISIBILITY_MS)
    try:
        await Housekeeping(host).reclaim()
    finally:
        await client.aclose()
    [(_, fields)] = redis.xrange(SECOND.stream)
    assert LOST_FIELD not in fields, "the run had returned: put back uncharged"
