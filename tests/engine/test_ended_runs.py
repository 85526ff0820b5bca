"""A run that returned is never charged a death, even when its strike never reached Redis.

The start journal's strike goes over the network. Under a link gone
half-open (the soak's network faults) it is swallowed without a word; a crash
of the process a few seconds later then left the run marked, and the reclaim
charged it a death: `retries_exhausted` with "its worker died during run 2 of
2" for a job whose run had ended. The process also notes each end in a file on
its host (engine/recovery/ended_runs.py), and whoever records its death strikes
those marks in the same pipeline.
"""

from __future__ import annotations

import os
import time

import pytest

from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.recovery import ended_runs
from chasqui_core.engine.recovery.ended_runs import EndedRuns
from chasqui_core.engine.recovery.reclaim import add_death_record
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.jobs.priority import MAX_PRIORITY
from chasqui_core.engine.store.keys import QueueKeys
from tests.engine.test_accounting import ghost_reads
from tests.engine.worker_app import read_runs, settled, wait_for
from tests.helpers import reclaim_now


def _die(redis, keys: QueueKeys, ghost: str) -> None:
    add_death_record(redis, keys, ghost, "killed by signal 9", now_ms())


def test_a_run_noted_ended_on_the_host_is_not_charged_though_its_mark_stayed_in_redis(redis, redis_url):
    keys = QueueKeys.for_queue("ended-runs")
    q = Queue(keys.queue, redis_client=redis)
    q.add("t")
    q.add("t")
    ghost = f"host:{os.getpid()}:ended"
    ended = EndedRuns(ghost)
    try:
        returned, running = ghost_reads(redis, keys, ghost, running=2)  # both marked running in Redis
        ended.ended(ended.name(keys.running(ghost)), returned)  # the first returned: its strike was lost
        _die(redis, keys, ghost)
        time.sleep(0.3)
        moved = {m.entry_id: m for m in reclaim_now(redis_url, keys, min_idle_ms=250)}
    finally:
        ended.close()
    assert not moved[returned].charged, "a run that returned must come back uncharged"
    assert moved[running].charged and moved[running].died, "the run under way is still charged its death"


def test_a_start_mark_that_reaches_redis_after_the_death_record_does_not_charge_a_run_noted_ended(redis, redis_url):
    """Through a slow or returning link, the dead process's start mark can land after its recorder struck it (the
    10-minute soak with network faults: a run ended 60 ms into a fresh process, which then died, was charged)."""
    keys = QueueKeys.for_queue("ended-late")
    q = Queue(keys.queue, redis_client=redis)
    q.add("t")
    q.add("t", priority=MAX_PRIORITY)  # the high band
    ghost = f"host:{os.getpid()}:late"
    ended = EndedRuns(ghost)
    high = keys.in_band("high")
    try:
        (returned,) = ghost_reads(redis, keys, ghost)
        (returned_high,) = ghost_reads(redis, high, ghost)
        ended.ended(ended.name(keys.running(ghost)), returned)
        ended.ended(ended.name(high.running(ghost)), returned_high)
        _die(redis, keys, ghost)
        redis.hset(keys.running(ghost), returned, now_ms() - 500)  # the mark, held up on the way, lands now
        redis.hset(high.running(ghost), returned_high, now_ms() - 500)
        time.sleep(0.3)
        moved = {m.entry_id: m for m in reclaim_now(redis_url, keys, min_idle_ms=250)}
        moved_high = {m.entry_id: m for m in reclaim_now(redis_url, high, min_idle_ms=250)}
    finally:
        ended.close()
    assert set(moved) == {returned} and set(moved_high) == {returned_high}
    assert not moved[returned].charged, "a run noted ended must come back uncharged, whenever its mark landed"
    assert not moved_high[returned_high].charged, "the same holds on a priority band's stream"
    assert redis.hlen(keys.running(ghost)) == 0 and redis.hlen(high.running(ghost)) == 0
    assert redis.pttl(keys.ended(ghost)) > 0 and redis.pttl(high.ended(ghost)) > 0, "the ended sets expire"


def test_only_the_dead_workers_own_queue_journals_are_struck_and_a_clean_stop_leaves_no_file(redis):
    ghost = f"host:{os.getpid()}:clean"
    ended = EndedRuns(ghost)
    a, b = QueueKeys.for_queue("ended-a"), QueueKeys.for_queue("ended-b")
    ended.ended(ended.name(a.running(ghost)), b"1-1")
    ended.ended(ended.name(b.running(ghost)), b"2-2")
    assert ended_runs.read(ghost) == {a.running(ghost): [b"1-1"], b.running(ghost): [b"2-2"]}
    redis.hset(a.running(ghost), mapping={b"1-1": 1, b"3-3": 3})
    redis.hset(b.running(ghost), b"2-2", 2)
    _die(redis, a, ghost)  # recorded on queue a only
    assert redis.hkeys(a.running(ghost)) == [b"3-3"]
    assert redis.hkeys(b.running(ghost)) == [b"2-2"], "queue b's record, when written, strikes its own"
    ended.close()
    assert ended_runs.read(ghost) == {} and not os.path.exists(ended_runs.path_of(ghost))


@pytest.mark.timeout(90)
def test_a_run_whose_code_returned_is_not_charged_when_the_process_dies_in_its_wrapper(redis, workers):
    """Django's task runner logs a failed task (a traceback, written to a log file) after the task's code raised,
    inside the handler: on a loaded host that took long enough for a crash beside it to land in between, and the
    run was charged a death though it had ended (the soak: 15 'finished run charged' in 10 minutes). The wrapper
    now says the run has ended first, and its mark is struck there."""
    queue = "ends-then-dies"
    q = Queue(queue, redis_client=redis)
    job_id = q.add("ends_then_dies_once").job_id
    first = workers.start(queue, visibility_ms=1000, concurrency=1)
    assert first.wait(60) == 1, "the first run's process died"
    workers.bury(redis, first, queue)  # its supervisor would record the death
    second = workers.start(queue, visibility_ms=1000, concurrency=1)
    try:
        wait_for(lambda: settled(redis, queue) and len(read_runs(redis)) == 2, 60, "the job to run again and settle")
    finally:
        second.terminate()
        second.wait(30)
    assert [(r.job_id, r.attempt) for r in read_runs(redis)] == [(job_id, 1), (job_id, 1)], (
        "the second run is attempt 1 again: the first, which had returned, was not charged")
    keys = QueueKeys.for_queue(queue)
    assert redis.xlen(keys.dlq) == 0
    totals = {k.decode(): int(v) for k, v in redis.hgetall(keys.metrics + "total").items()}
    assert totals.get("lost", 0) == 0


def test_a_process_that_stops_leaving_entries_pending_keeps_its_ends_for_the_recorder_of_its_death():
    """Stopping with outcomes it could not settle (a partition), the process's entries are reclaimed later by a
    worker beside it, which records its death then; a strike the partition swallowed may reach Redis only after the
    stop, so the ends stay on the host for that recorder."""
    ghost = f"host:{os.getpid()}:keeps"
    ended = EndedRuns(ghost)
    key = QueueKeys.for_queue("ended-keep").running(ghost)
    ended.ended(ended.name(key), b"7-7")
    ended.close(keep=True)
    try:
        assert ended_runs.read(ghost) == {key: [b"7-7"]}
    finally:
        os.unlink(ended_runs.path_of(ghost))
