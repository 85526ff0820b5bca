"""A delivery another worker took back while this one held it leaves this worker's hands: it never writes what
the run came to (the other worker owns the entry now), says so once, and stops reporting it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.worker_app import wait_for
from tests.helpers import reclaim_now, worker_running


def test_an_entry_taken_back_while_running_is_let_go_and_its_late_outcome_is_not_written(redis, redis_url, caplog):
    queue, registry = "lease-loss", HandlerRegistry()
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(20)
        finished.set()

    registry.register("t.slow", slow)
    registry.register("t.quick", lambda: None)
    keys = QueueKeys.for_queue(queue)
    q = Queue(queue, url=redis_url)
    job_id = q.add("t.slow").job_id
    caplog.set_level(logging.WARNING, logger="chasqui.worker")
    with worker_running(redis_url, [queue], registry, concurrency=2, visibility_timeout_ms=1500) as worker:
        assert started.wait(10)
        [[entry_id, _]] = redis.xrange(keys.stream)
        # The other worker is alive (its alive key stands), so recovery leaves its entry alone however slow the
        # host is; the claim is what its reclaim would do.
        redis.set(keys.alive("another-worker"), b"1", px=120_000)
        redis.xclaim(keys.stream, GROUP, "another-worker", 0, [entry_id])

        def reports() -> list[str]:
            return [r.getMessage() for r in caplog.records if "taken back by another worker" in r.getMessage()]

        wait_for(lambda: len(worker.held) == 0, 10, "the worker to let go of the entry taken back")
        wait_for(lambda: len(reports()) >= 1, 10, "the report of the entry taken back")  # logged after letting go
        lines = reports()
        assert len(lines) == 1 and job_id in lines[0]
        release.set()
        assert finished.wait(10)
        q.add("t.quick")  # a later job settles normally: the settler flushed after the late run
        wait_for(lambda: worker.stats.processed >= 1, 10, "the quick job")
        wait_for(lambda: redis.xpending(keys.stream, GROUP)["pending"] == 1, 10, "the quick job acknowledged")
        wait_for(lambda: len(reports()) == 1 and worker.stats.processed >= 1, 5, "no repeat of the report")
    pending = redis.xpending_range(keys.stream, GROUP, "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(entry_id, b"another-worker")], \
        "the entry stays the other worker's: this one neither acknowledged nor put back its run"
    assert worker.stats.processed == 1, "the dropped run is not counted as processed here"
    assert int(redis.xlen(keys.dlq)) == 0


def test_a_lease_pass_that_keeps_failing_holds_back_neither_the_heartbeat_nor_the_other_streams(redis, redis_url,
                                                                                                   caplog):
    """The lease pass of one queue fails at every turn (its start-journal key holds a value of the wrong type):
    the heartbeat still beats, and the other queue's jobs still run; the warning is held to one a second."""
    import msgpack

    broken, fine = QueueKeys.for_queue("hk-broken"), QueueKeys.for_queue("hk-fine")
    redis.set(broken.running("w-hk"), "not a hash")
    registry = HandlerRegistry()
    ran: list[int] = []
    registry.register("t.quick", lambda: ran.append(1))
    caplog.set_level(logging.WARNING, logger="chasqui.worker")
    with worker_running(redis_url, [broken.queue, fine.queue], registry, worker_id="w-hk",
                        visibility_timeout_ms=600, heartbeat_interval=0.2) as worker:
        wait_for(lambda: redis.hget(fine.workers, "w-hk") is not None, 10, "the first heartbeat")
        first = msgpack.unpackb(redis.hget(fine.workers, "w-hk"))["last_seen"]
        wait_for(lambda: msgpack.unpackb(redis.hget(fine.workers, "w-hk"))["last_seen"] >= first + 1000, 10,
                 "heartbeats a second later, though every lease pass fails")
        Queue(fine.queue, url=redis_url).add("t.quick")
        wait_for(lambda: ran == [1], 10, "a job of the other queue to run")
        assert worker.id == "w-hk"
    failures = [r for r in caplog.records if "the lease pass failed" in r.getMessage()]
    assert 1 <= len(failures) <= 15, f"{len(failures)} warnings: held to about one a second"


def test_a_problem_the_worker_reported_is_shown_until_it_has_not_been_seen_for_a_while(monkeypatch):
    """A reader that failed while Redis restarted reads again: its problem must not stay on the heartbeat."""
    from chasqui_core.engine.worker import worker as worker_module
    from chasqui_core.engine.worker.worker import Worker

    monkeypatch.setattr(worker_module, "PROBLEM_SHOWN_S", 0.2)
    w = Worker(["hk-problem"], HandlerRegistry(), install_signal_handlers=False)
    assert w.problem == ""
    w.problem = "reading hk-problem: ConnectionError: refused"
    assert w.problem == "reading hk-problem: ConnectionError: refused"
    wait_for(lambda: w.problem == "", 5, "the problem to be over once not seen again")


def test_a_worker_stopping_after_its_alive_key_lapsed_keeps_the_runs_it_is_finishing(redis, redis_url):
    """A worker cut off past its visibility timeout lets its alive key lapse. As it begins to stop, it records
    its own end (so that a crash while it winds down is charged as a death), and it used to leave the key lapsed
    until its next lease pass: a reclaim in between took the run it was still finishing and charged it a death
    (the soak: a job charged its second death, a panic, 0.8 s before its run succeeded). The stop sets the alive
    key again with the record."""
    keys = QueueKeys.for_queue("stopping-lapsed")
    registry = HandlerRegistry()
    started, finished = threading.Event(), threading.Event()
    release = threading.Event()

    async def slow(ctx):
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.02)
        finished.set()

    registry.register("t.slow", slow, takes_context=True)
    Queue(keys.queue, url=redis_url).add("t.slow")
    with worker_running(redis_url, [keys.queue], registry, visibility_timeout_ms=30_000,
                        shutdown_timeout=20) as worker:
        assert started.wait(20), "the job started"
        redis.delete(keys.alive(worker.id))  # lapsed while it was cut off
        worker.request_stop()
        wait_for(lambda: redis.exists(keys.died(worker.id)), 10, "the stop's record of its end")
        time.sleep(0.3)
        moved = reclaim_now(redis_url, keys, min_idle_ms=100)
        release.set()
        assert finished.wait(20)
    assert moved == [], "a run the stopping worker is still finishing must not be taken back"
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.metrics + "total").items()}
    assert totals.get("lost", 0) == 0 and totals.get("completed") == 1
