"""``runworker --processes N`` with real processes: a supervisor, its worker children, signals, Redis.

Every test starts ``manage.py runworker`` as operators do, on the test
server, with ``tests.supervisor.settings`` (the project plus the ``nap``
task), and follows the children through their heartbeats and the runs the
task records in Redis. Start-up of a Django process can take many seconds on
a busy machine, so the bounds are generous; nothing here measures time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter

import pytest
from django.core.management import CommandError, call_command

from chasqui_core.engine.ops import control, stats
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.worker.worker import Worker
from chasqui_core.supervised_child import READY_FD_ENV, SUPERVISOR_PID_ENV, SupervisedChild
from chasqui_core.supervisor_rules import child_command, describe_exit, restart_delay
from tests.engine.worker_app import wait_for
from tests.supervisor.app import DONE, QUEUE, STARTED
from tests.supervisor.processes import KEYS, WAIT
from tests.supervisor.processes import alive as _alive
from tests.supervisor.processes import children_of as _children_of
from tests.supervisor.processes import nap as _nap
from tests.supervisor.processes import runs as _runs


# --- with real processes ---------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_a_child_killed_with_sigkill_is_replaced_and_its_job_still_completes(start, redis):
    supervisor = start("--processes", "2", "--visibility-timeout", "2000", "--concurrency", "2")
    first = supervisor.wait_workers(redis, 2)
    _nap(redis, "doomed", 3)
    [(_, victim)] = supervisor.wait("the job starts", lambda: _runs(redis, STARTED))
    assert victim in first
    os.kill(victim, signal.SIGKILL)

    survivors = supervisor.wait_workers(redis, 2, not_among={victim})
    assert len(survivors - first) == 1, "one new process took the dead one's place"
    [(job, finisher)] = supervisor.wait("the dead process's job completes elsewhere", lambda: _runs(redis, DONE))
    assert job == "doomed" and finisher != victim
    assert [job for job, _ in _runs(redis, STARTED)] == ["doomed", "doomed"], "it ran again, once"
    assert redis.xlen(KEYS.dlq) == 0
    totals = {k.decode(): int(v) for k, v in redis.hgetall(KEYS.totals).items()}
    assert (totals.get("lost"), totals.get("lost_contact", 0)) == (1, 0), (
        "the supervisor saw its child die: the run under way is a death, not lost contact")
    log = supervisor.log()
    assert f"worker process {victim} (slot" in log and "was killed by SIGKILL; restarting now" in log
    assert supervisor.stop() == 0


@pytest.mark.timeout(600)
def test_a_child_that_dies_after_it_read_its_queues_is_replaced_at_once_every_time(start, redis):
    """Backing off is for children that cannot start. One that read its queues and then died (a job that killed
    it, an OOM kill) is replaced at once however often that happens: the crash jobs of a soak, killing a process
    every few seconds, left both slots of a supervisor empty for half a minute at a time, and the queues unread."""
    supervisor = start("--processes", "1", "--max-jobs", "100000")  # a limit makes one process supervised
    gone: set[int] = set()
    for _ in range(3):
        [pid] = supervisor.wait_workers(redis, 1, not_among=gone)
        supervisor.wait(f"process {pid} ready", lambda pid=pid: f"worker process {pid} (slot 0) is ready" in
                        supervisor.log())
        gone.add(pid)
        os.kill(pid, signal.SIGKILL)
    supervisor.wait_workers(redis, 1, not_among=gone)
    log = supervisor.log()
    assert log.count("was killed by SIGKILL; restarting now") == 3 and "quick exits in a row" not in log, log
    assert supervisor.stop() == 0


@pytest.mark.timeout(600)
def test_sigterm_lets_running_jobs_finish_stops_every_child_and_exits_0(start, redis):
    supervisor = start("--processes", "2")
    children = supervisor.wait_workers(redis, 2)
    _nap(redis, "last-one", 2)
    supervisor.wait("the job starts", lambda: _runs(redis, STARTED))

    assert supervisor.stop(signal.SIGTERM) == 0
    assert not [pid for pid in children if _alive(pid)], "no child outlives its supervisor"
    assert _children_of(supervisor.pid) == set()
    assert [job for job, _ in _runs(redis, DONE)] == ["last-one"], "the running job was let finish"
    assert redis.hgetall(KEYS.workers) == {}, "every child stopped cleanly and took its heartbeat away"
    assert redis.xpending(KEYS.stream, "chasqui")["pending"] == 0
    log = supervisor.log()
    assert "stopping 2 worker process(es)" in log and f"supervisor {supervisor.pid}: stopped" in log


@pytest.mark.timeout(600)
def test_a_child_an_operator_stops_is_not_replaced_and_the_last_one_ends_the_supervisor(start, redis):
    supervisor = start("--processes", "2")
    first, second = sorted(supervisor.wait_workers(redis, 2))
    by_pid = {w.pid: w.id for w in stats.workers(redis, QUEUE)}
    assert control.send(Scripts(redis), by_pid[first], "stop")
    supervisor.wait("the stopped child exits", lambda: not _alive(first))
    time.sleep(2)  # a replacement would have started and beaten by now
    assert supervisor.worker_pids(redis) == {second}, "the stopped child's slot stays empty"
    assert "was stopped by an operator; not starting another in its slot" in supervisor.log()

    assert control.send(Scripts(redis), by_pid[second], "stop")
    assert supervisor.proc.wait(WAIT) == 0, supervisor.log()
    assert "every worker process was stopped by an operator; exiting" in supervisor.log()
    assert redis.hgetall(KEYS.workers) == {}


@pytest.mark.timeout(600)
def test_children_stop_by_themselves_when_the_supervisor_is_killed(start, redis):
    supervisor = start("--processes", "2")
    children = supervisor.wait_workers(redis, 2)
    supervisor.stop(signal.SIGKILL)

    supervisor.wait("every orphaned child exits", lambda: not [pid for pid in children if _alive(pid)])
    supervisor.wait("the children stopped cleanly (heartbeats removed)", lambda: redis.hgetall(KEYS.workers) == {})


@pytest.mark.timeout(600)
def test_sighup_replaces_every_child_one_by_one_while_jobs_keep_running(start, redis):
    supervisor = start("--processes", "2", "--concurrency", "4")
    old = supervisor.wait_workers(redis, 2)
    keys: list[str] = []
    reloading = threading.Event()

    def feed() -> None:
        """A steady trickle of short jobs for the whole reload."""
        while not reloading.is_set() or len(keys) < 5:
            key = f"job-{len(keys)}"
            keys.append(key)
            _nap(redis, key, 0.2)
            time.sleep(0.25)
            if len(keys) > 2000:
                return

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        supervisor.proc.send_signal(signal.SIGHUP)
        new = supervisor.wait_workers(redis, 2, not_among=old)
        supervisor.wait("the reload ends", lambda: "reload done" in supervisor.log())
    finally:
        reloading.set()
        feeder.join()

    supervisor.wait("every job enqueued runs", lambda: len(_runs(redis, DONE)) >= len(keys))
    done = Counter(job for job, _ in _runs(redis, DONE))
    assert set(done) == set(keys) and set(done.values()) == {1}, "each job ran once, none lost"
    assert redis.xlen(KEYS.dlq) == 0
    ran_on = {pid for _, pid in _runs(redis, DONE)}
    assert ran_on & old and ran_on & new, "jobs ran before and after the reload"
    supervisor.wait("the old processes exit", lambda: not [pid for pid in old if _alive(pid)])
    assert supervisor.proc.poll() is None, "the supervisor itself stays"
    assert supervisor.stop() == 0


class _Asking:
    """A supervisor's side of ``Worker.ask_successor``, kept in the test: it notes each request and says yes."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> bool:
        self.reasons.append(reason)
        return True


@contextlib.contextmanager
def _supervised_worker(redis_url: str, queue: str, registry: HandlerRegistry, asking: _Asking, **options):
    """A worker in a thread of this process that can ask for a successor, as a supervised child can."""
    worker = Worker([queue], registry, url=redis_url, install_signal_handlers=False, block_ms=50,
                    heartbeat_interval=0.05, promoter_poll_interval=0.02, supervisor_pid=os.getpid(), **options)
    worker.ask_successor = asking
    thread = threading.Thread(target=worker.run_sync, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(60)
    assert not thread.is_alive(), "the worker did not stop"


def test_a_worker_past_two_sync_timeouts_asks_once_and_keeps_running_sync_jobs(redis, redis_url):
    release = threading.Event()
    done: list[int] = []
    registry = HandlerRegistry()
    registry.register("hang", lambda: release.wait(60), timeout=0.3, max_attempts=2)
    registry.register("quick", done.append)
    queue = Queue("recycle-asks-once", redis_client=redis)
    keys = QueueKeys.for_queue(queue.name)
    asking = _Asking()
    queue.add("hang")
    try:
        with _supervised_worker(redis_url, queue.name, registry, asking, concurrency=1) as worker:
            wait_for(lambda: redis.xlen(keys.dlq) == 1, 60, "both runs of the hung job to be charged their timeout")
            queue.add("quick", [1])  # its one thread is stuck twice over: a fresh one runs this
            wait_for(lambda: done == [1], 30, "a sync job after the hung ones")
            assert not worker.stopping.is_set(), "it works on until the supervisor stops it"
    finally:
        release.set()
    assert len(asking.reasons) == 1 and "ran past its timeout of 0.3 s" in asking.reasons[0], asking.reasons
    assert worker.recycle_reason == asking.reasons[0]
    assert worker.unfinished_sync_jobs == 2, "both stuck threads are left behind when it stops"


def test_a_worker_over_its_memory_limit_asks_once_for_a_successor_and_works_on(redis, redis_url):
    done: list[int] = []
    registry = HandlerRegistry()
    registry.register("quick", done.append)
    queue = Queue("recycle-memory", redis_client=redis)
    asking = _Asking()
    with _supervised_worker(redis_url, queue.name, registry, asking, max_memory_mb=1) as worker:
        checks: list[int] = []
        check_memory = worker.check_memory

        def counted() -> None:
            checks.append(1)
            check_memory()

        worker.check_memory = counted  # type: ignore[method-assign]
        wait_for(lambda: len(checks) >= 5, 30, "a few memory checks, every one over the limit")
        queue.add("quick", [1])
        wait_for(lambda: done == [1], 30, "a job added after it asked")
        assert not worker.stopping.is_set()
    assert len(asking.reasons) == 1 and asking.reasons[0].startswith("memory at "), asking.reasons


# --- the parts that need no process -------------------------------------------------------------------


def test_restart_delay_grows_to_its_cap():
    delays = [restart_delay(deaths, first=1.0, cap=30.0) for deaths in range(1, 9)]
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_exits_are_described_in_words():
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"


def test_a_child_knows_its_supervisor_from_the_environment_only():
    assert SupervisedChild.from_environment({}) is None
    child = SupervisedChild.from_environment({SUPERVISOR_PID_ENV: "4242", READY_FD_ENV: "7"})
    assert child == SupervisedChild(4242, 7)


def test_children_are_started_the_way_the_supervisor_was():
    assert child_command("/srv/app/manage.py", ["runworker", "q"]) == [sys.executable, "/srv/app/manage.py",
                                                                         "runworker", "q"]
    assert child_command("/x/lib/django/__main__.py", ["runworker", "q"])[1:] == ["-m", "django", "runworker", "q"]


@pytest.mark.parametrize("options, message", [
    ({"processes": "many"}, "--processes must be a whole number of 1 or more, or 'auto'"),
    ({"processes": "0"}, "--processes must be a whole number of 1 or more"),
    ({"max_jobs": 0}, "--max-jobs must be 1 or more"),
    ({"max_memory": -5}, "--max-memory must be 1 or more"),
])
def test_bad_process_options_are_refused_in_words(options, message):
    with pytest.raises(CommandError, match=message):
        call_command("runworker", QUEUE, **options)


def test_a_worker_over_its_memory_limit_stops_itself_and_says_why(redis, redis_url):
    """Any Python process holds more than 1 MB, so the first check after start-up recycles the worker."""
    worker = Worker([QUEUE], HandlerRegistry(), url=redis_url, install_signal_handlers=False, heartbeat_interval=0.05,
                    max_memory_mb=1)

    async def run_until_stopped():
        await asyncio.wait_for(worker.run(), timeout=60)

    asyncio.run(run_until_stopped())
    assert worker.recycle_reason.startswith("memory at ") and "(max_memory_mb 1)" in worker.recycle_reason
    assert redis.hgetall(KEYS.workers) == {}
