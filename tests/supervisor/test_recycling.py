"""Recycling under ``runworker --processes N``, with real processes: a successor reads before its predecessor stops.

A process past a sync job's timeout, its ``--max-jobs`` or its memory limit is replaced without a gap in
reading; started as in test_supervisor.py (tests/supervisor/processes.py), with the same generous bounds.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter

import pytest

from chasqui_core.engine.ops import control, stats
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.store.scripts import Scripts
from tests.supervisor.app import HANG, HUNG, QUEUE, START_HOOK_ENV, STARTS, TICK, TICKS
from tests.supervisor.processes import KEYS, Supervised, WAIT, alive as _alive, children_of as _children_of


# --- recycling: the successor reads before its predecessor stops ------------------------------------------------

SLOW_START = 8.0
"""Seconds a successor spends starting in the recycling tests (on top of its own start-up), so a stall shows."""
TICK_EVERY = 0.2


class Feeder:
    """Adds a ``tick`` job every TICK_EVERY seconds from a thread; notes the most worker processes seen at once."""

    def __init__(self, redis, supervisor: Supervised) -> None:
        self.queue = Queue(QUEUE, redis_client=redis)
        self.supervisor = supervisor
        self.keys: list[str] = []
        self.most_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)

    def _feed(self) -> None:
        while not self._stop.is_set() and len(self.keys) < 5000:
            key = f"tick-{len(self.keys)}"
            self.queue.add(TICK, [key])
            self.keys.append(key)
            self.most_processes = max(self.most_processes, len(_children_of(self.supervisor.pid)))
            self._stop.wait(TICK_EVERY)


def _ticks(redis) -> list[tuple[str, int, float]]:
    """(job key, pid, unix time it started) of every run of ``tick``, in the order they started."""
    out = []
    for raw in redis.lrange(TICKS, 0, -1):
        key, pid, at = raw.decode().rsplit(":", 2)
        out.append((key, int(pid), float(at)))
    return sorted(out, key=lambda tick: tick[2])


def _slow_starts(redis) -> dict[int, tuple[float, float]]:
    """pid -> (when its slow start began, when it ended), of each process started while the hook said to wait."""
    out = {}
    for raw in redis.lrange(STARTS, 0, -1):
        pid, began, ended = raw.decode().split(":")
        out[int(pid)] = (float(began), float(ended))
    return out


def _largest_gap(ticks: list[tuple[str, int, float]]) -> float:
    times = [at for _, _, at in ticks]
    return max(later - earlier for earlier, later in itertools.pairwise(times))


def _ran_by(ticks: list[tuple[str, int, float]]) -> list[int]:
    """Pids of the processes that ran ticks, in the order of their first."""
    return list(dict.fromkeys(pid for _, pid, _ in ticks))


def _check_every_tick_ran_once(redis, supervisor: Supervised, feeder: Feeder) -> list[tuple[str, int, float]]:
    supervisor.wait("every tick added runs", lambda: len(_ticks(redis)) >= len(feeder.keys))
    ticks = _ticks(redis)
    runs = Counter(key for key, _, _ in ticks)
    assert set(runs) == set(feeder.keys) and set(runs.values()) == {1}, "each tick ran once, none lost"
    return ticks


@pytest.mark.timeout(600)
def test_a_sync_job_past_its_timeout_recycles_its_process_without_a_gap_in_reading(start, redis, tmp_path):
    hook = tmp_path / "start-hook"
    # A limit never reached, for a supervisor with one process: nothing else would read while it is replaced.
    supervisor = start("--processes", "1", "--max-memory", "65536", "--concurrency", "1",
                       env={START_HOOK_ENV: str(hook)})
    [first] = supervisor.wait_workers(redis, 1)
    hook.write_text(str(SLOW_START))  # from now on a process takes this much longer to start
    feeder = Feeder(redis, supervisor).start()
    try:
        supervisor.wait("a few ticks run", lambda: len(_ticks(redis)) >= 3)
        Queue(QUEUE, redis_client=redis).add(HANG)
        supervisor.wait("the hung job is charged its timeout", lambda: redis.xlen(KEYS.dlq) == 1)
        [second] = supervisor.wait_workers(redis, 1, not_among={first})
        supervisor.wait("the successor runs ticks", lambda: second in _ran_by(_ticks(redis)))
    finally:
        feeder.stop()
    ticks = _check_every_tick_ran_once(redis, supervisor, feeder)

    assert [int(pid) for pid in redis.lrange(HUNG, 0, -1)] == [first]
    [(_, dead)] = redis.xrange(KEYS.dlq)
    assert (dead[b"reason"], dead[b"error_class"]) == (b"retries_exhausted",
                                                        b"chasqui_core.engine.jobs.errors.JobTimeout")
    assert _ran_by(ticks) == [first, second]
    began, ended = _slow_starts(redis)[second]
    while_starting = [at for _, pid, at in ticks if pid == first and began <= at <= ended]
    # One every TICK_EVERY s for SLOW_START s, its only thread stuck in the hung job: a few are plenty.
    assert len(while_starting) >= 5, "the old process took jobs (on a fresh thread) while its successor started"
    assert _largest_gap(ticks) < SLOW_START / 2, "no stretch the length of a start with nothing reading"
    assert feeder.most_processes <= 2, "one process above the count, at most"
    log = supervisor.log()
    assert f"worker process {first} (slot 0) reached its limit; it goes on while its successor starts" in log
    assert f"stopping worker process {first} (slot 0): replaced by {second}" in log
    assert supervisor.stop() == 0


@pytest.mark.timeout(600)
def test_max_jobs_recycles_a_process_once_its_successor_reads(start, redis, tmp_path):
    hook = tmp_path / "start-hook"
    supervisor = start("--processes", "1", "--max-jobs", "5", "--concurrency", "2", env={START_HOOK_ENV: str(hook)})
    supervisor.wait_workers(redis, 1)
    hook.write_text(str(SLOW_START))
    feeder = Feeder(redis, supervisor).start()
    try:
        supervisor.wait("three processes in turn run ticks", lambda: len(_ran_by(_ticks(redis))) >= 3)
    finally:
        feeder.stop()
    ticks = _check_every_tick_ran_once(redis, supervisor, feeder)

    order = _ran_by(ticks)
    per_process = Counter(pid for _, pid, _ in ticks)
    starts = _slow_starts(redis)
    for old, new in itertools.pairwise(order):
        assert per_process[old] > 5, f"{old} worked past its limit while its successor started: {per_process}"
        began, ended = starts[new]
        assert len([at for _, pid, at in ticks if pid == old and began <= at <= ended]) >= 5, (old, new)
    assert _largest_gap(ticks) < SLOW_START / 2, "no stretch the length of a start with nothing reading"
    assert feeder.most_processes <= 2, "one process above the count, at most"
    assert redis.xlen(KEYS.dlq) == 0
    log = supervisor.log()
    assert "recycling: 5 jobs processed (max_jobs 5); it goes on until its successor reads" in log
    assert log.count("asked for a successor again") == 0
    assert supervisor.stop() == 0


@pytest.mark.timeout(600)
def test_processes_recycling_together_are_replaced_one_at_a_time(start, redis, tmp_path):
    hook = tmp_path / "start-hook"
    supervisor = start("--processes", "2", "--max-jobs", "4", "--concurrency", "2", env={START_HOOK_ENV: str(hook)})
    first = supervisor.wait_workers(redis, 2)
    hook.write_text(str(SLOW_START))
    feeder = Feeder(redis, supervisor).start()
    try:  # both reach their limit within a second or two of each other
        supervisor.wait("both first processes replaced", lambda: not [pid for pid in first if _alive(pid)])
        supervisor.wait("two successors run ticks", lambda: len(set(_ran_by(_ticks(redis))) - first) >= 2)
    finally:
        feeder.stop()
    ticks = _check_every_tick_ran_once(redis, supervisor, feeder)

    assert feeder.most_processes <= 3, "one process above the count, at most, though both asked at once"
    assert _largest_gap(ticks) < SLOW_START / 2, "no stretch the length of a start with nothing reading"
    log = supervisor.log()
    assert all(re.search(rf"worker process {pid} \(slot \d\) reached its limit", log) for pid in first), log
    assert supervisor.stop() == 0


@pytest.mark.timeout(600)
def test_a_successor_that_fails_to_start_leaves_its_predecessor_working(start, redis, tmp_path):
    hook = tmp_path / "start-hook"
    supervisor = start("--processes", "1", "--max-jobs", "2", env={START_HOOK_ENV: str(hook)})
    [first] = supervisor.wait_workers(redis, 1)
    hook.write_text("fail")  # every process started from now on exits before it is ready
    feeder = Feeder(redis, supervisor).start()
    try:
        supervisor.wait("two successors fail", lambda: supervisor.log().count("another successor is tried in") >= 2)
        after_failures = time.time()
        supervisor.wait("the old process goes on taking jobs",
                        lambda: [at for _, pid, at in _ticks(redis) if pid == first and at > after_failures])
        assert supervisor.worker_pids(redis) == {first}
        hook.unlink()
        [second] = supervisor.wait_workers(redis, 1, not_among={first})
        supervisor.wait("the successor runs ticks", lambda: second in _ran_by(_ticks(redis)))
    finally:
        feeder.stop()
    ticks = _check_every_tick_ran_once(redis, supervisor, feeder)

    assert _ran_by(ticks)[:2] == [first, second]
    assert feeder.most_processes <= 2, "one process above the count, at most"
    log = supervisor.log()
    assert (f"started to take over from worker process {first} (slot 0), exited with code 3 before it was ready; "
            f"{first} keeps running") in log
    assert f"stopping worker process {first} (slot 0): replaced by {second}" in log
    assert supervisor.stop() == 0


@pytest.mark.timeout(600)
def test_a_recycling_process_an_operator_stops_takes_its_successor_along(start, redis, tmp_path):
    hook = tmp_path / "start-hook"
    supervisor = start("--processes", "1", "--max-jobs", "1", env={START_HOOK_ENV: str(hook)})
    [first] = supervisor.wait_workers(redis, 1)
    hook.write_text(str(SLOW_START))
    Queue(QUEUE, redis_client=redis).add(TICK, ["the-one"])
    supervisor.wait("it asks for a successor", lambda: "reached its limit; it goes on" in supervisor.log())
    [worker_id] = [w.id for w in stats.workers(redis, QUEUE) if w.pid == first]
    assert control.send(Scripts(redis), worker_id, "stop")

    assert supervisor.proc.wait(WAIT) == 0, supervisor.log()
    log = supervisor.log()
    assert "slot 0 was stopped by an operator" in log, "the successor is not kept in a slot an operator emptied"
    assert "every worker process was stopped by an operator; exiting" in log
    assert [key for key, _, _ in _ticks(redis)] == ["the-one"]
