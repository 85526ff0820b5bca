"""A child that dies right after its supervisor: nobody saw it end, and its run is still charged as a death.

A supervisor records the death of each child that exits, and a child whose
supervisor is gone records its own end as it begins to stop. A child that
dies in the instant between (a crash while the news of its supervisor's death
is on its way) leaves no record from either; a worker of the same host then
finds its process gone and records it (recovery/deathwatch.py), so its run
is charged as a death, toward ``panic``, and not as lost contact. Here the
child is frozen (SIGSTOP) before its supervisor is killed, so it can write
nothing at all before its own SIGKILL: without the look from beside, the run
is lost contact.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from urllib.parse import urlsplit

import msgpack
import pytest

from chasqui_core.engine.jobs.envelope import now_ms
from bench.faultproxy import FaultProxy
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.ops import stats
from chasqui_core.engine.recovery.deathwatch import (SPACE_FIELD, DeathWatch, note_clean_stop, process_space,
                                                    stopped_cleanly)
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.worker import Worker
from tests.supervisor.app import DONE, QUEUE, STARTED
from tests.supervisor.processes import KEYS, alive, nap, runs


@pytest.mark.timeout(600)
def test_a_child_killed_just_after_its_supervisor_is_charged_a_death_not_lost_contact(start, redis):
    first = start("--processes", "2", "--visibility-timeout", "2000", "--concurrency", "2")
    first.wait_workers(redis, 2)
    nap(redis, "orphaned", 5)
    [(_, victim)] = first.wait("the job starts", lambda: runs(redis, STARTED))
    [worker_id] = [w.id for w in stats.workers(redis, QUEUE) if w.pid == victim]

    siblings = first.worker_pids(redis) - {victim}
    # The supervisor is stopped first, so it can neither reap nor record its children's ends; then they are
    # killed, then it. (Stopping the children instead does not hold: when the supervisor dies, the kernel
    # continues the stopped members of its orphaned process group with SIGHUP and SIGCONT.)
    os.kill(first.pid, signal.SIGSTOP)
    first.wait("the supervisor is stopped", lambda: _state(first.pid) == "T")
    for pid in (victim, *siblings):
        os.kill(pid, signal.SIGKILL)
    first.stop(signal.SIGKILL)
    first.wait("the orphaned processes are gone", lambda: not [p for p in first.seen_children if alive(p)])
    assert not redis.exists(KEYS.died(worker_id)), ("nobody could have seen the victim end",
                                                    redis.get(KEYS.died(worker_id)))

    second = start("--processes", "1", "--visibility-timeout", "2000")
    [(job, finisher)] = second.wait("the orphan's job runs again and completes", lambda: runs(redis, DONE))
    assert job == "orphaned" and finisher != victim
    totals = {k.decode(): int(v) for k, v in redis.hgetall(KEYS.totals).items()}
    assert (totals.get("lost"), totals.get("lost_contact", 0)) == (1, 0), (
        "its process was gone: the run under way is a death, not lost contact", totals)
    record = redis.get(KEYS.died(worker_id)).decode()
    assert f"its process {worker_id} is gone (seen by" in record, record
    assert redis.xlen(KEYS.dlq) == 0
    assert second.stop() == 0


def _state(pid: int) -> str:
    """A process's state letter in /proc (``T``: stopped); a stop signal takes a moment to take hold."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _beat(redis, keys: QueueKeys, worker_id: str, *, pid: int, started_at: int, space: str) -> None:
    redis.hset(keys.workers, worker_id, msgpack.packb({"id": worker_id, "pid": pid, "started_at": started_at,
                                                       "last_seen": now_ms(), SPACE_FIELD: space}))


async def test_only_workers_of_this_process_space_whose_process_ended_are_recorded_dead(redis, redis_url):
    """A live process is not dead; a pid now held by a process that began later (reused) is, unless it left the
    note of a clean stop; a worker of another host or pid namespace is never judged, whatever its pid; a record
    already there is kept."""
    keys = QueueKeys.for_queue("deathwatch")
    here = process_space()
    assert here, "this test needs /proc (Linux)"
    began_here = now_ms() - 10
    _beat(redis, keys, "live", pid=os.getpid(), started_at=began_here, space=here)
    _beat(redis, keys, "reused", pid=os.getpid(), started_at=began_here - 3600_000 * 24 * 365, space=here)
    stopped = f"stopped-{uuid.uuid4().hex}"
    _beat(redis, keys, stopped, pid=os.getpid(), started_at=0, space=here)
    note_clean_stop(stopped)  # it exited cleanly while Redis was out of its reach
    _beat(redis, keys, "elsewhere", pid=os.getpid(), started_at=0, space="another-host/pid:[1]")
    _beat(redis, keys, "recorded", pid=os.getpid(), started_at=0, space=here)
    redis.set(keys.died("recorded"), "1 was killed by SIGKILL")
    client = aconnect(redis_url)
    try:
        watch = DeathWatch(client, "me")
        assert await watch.look([keys]) == ["recorded", "reused"]
        assert await watch.look([keys]) == [], "a death is recorded once"
    finally:
        await client.aclose()
    assert redis.exists(keys.died("reused")) and not redis.exists(keys.died("live"))
    assert not redis.exists(keys.died("elsewhere")) and not redis.exists(keys.died(stopped))
    assert redis.get(keys.died("recorded")) == b"1 was killed by SIGKILL", "the first record says how it ended"


async def test_a_worker_that_stops_cleanly_out_of_redis_reach_leaves_the_note_that_keeps_it_from_being_judged_dead(
        redis, redis_url):
    """Cut off as it stops, a worker can neither settle nor take its heartbeat away; its runs had ended, so it
    notes its clean stop on the host, and no worker beside it may record its end as a death."""
    keys = QueueKeys.for_queue("stops-cut-off")
    server = urlsplit(redis_url)
    with FaultProxy(int(server.port or 6379)) as proxy:
        worker = Worker([keys.queue], HandlerRegistry(), url=f"redis://{proxy.host}:{proxy.port}{server.path or '/0'}",
                        install_signal_handlers=False, heartbeat_interval=0.05, shutdown_timeout=1.0)
        run = asyncio.ensure_future(worker.run())
        while not redis.hexists(keys.workers, worker.id):
            assert not run.done(), "the worker stopped before its first heartbeat"
            await asyncio.sleep(0.05)
        assert not stopped_cleanly(worker.id)
        proxy.refuse()
        worker.request_stop()
        await asyncio.wait_for(run, timeout=120)
    assert redis.hexists(keys.workers, worker.id), "it could not take its heartbeat away"
    assert stopped_cleanly(worker.id), "a clean stop out of Redis's reach is noted on the host"
