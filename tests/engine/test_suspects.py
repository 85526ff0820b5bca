"""Suspects (jobs charged a run lost with a worker that died) run alone, and whatever path a suspect takes out of
the worker's hands, the jobs held back behind it go on."""

from __future__ import annotations

import threading
import time

from chasqui_core.engine.jobs.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.worker_app import wait_for
from tests.helpers import worker_running


def add_suspect(redis, keys: QueueKeys, task: str) -> str:
    """A job as a reclaim leaves it once charged: one run made, lost with a worker that died."""
    job_id = new_job_id()
    lost = error_record(attempt=1, exc_class="WorkerLost", message="worker lost", traceback="", worker="gone",
                        started_at=now_ms() - 1000, finished_at=now_ms())
    job = Job(id=job_id, task=task, attempt=1, deaths=1, errors=[lost], created_at=now_ms())
    redis.xadd(keys.stream, {"j": job.encode()})
    return job_id


def test_a_suspect_runs_with_nothing_beside_it_and_the_others_go_on_after_it(redis, redis_url):
    keys = QueueKeys.for_queue("suspects")
    registry = HandlerRegistry()
    running: list[str] = []
    beside: list[list[str]] = []
    lock = threading.Lock()

    def job(name: str):
        def run() -> None:
            with lock:
                running.append(name)
                beside.append(list(running))
            threading.Event().wait(0.05)
            with lock:
                running.remove(name)
        return run

    registry.register("t.suspect", job("suspect"))
    registry.register("t.other", job("other"))
    q = Queue(keys.queue, url=redis_url)
    with worker_running(redis_url, [keys.queue], registry, concurrency=4) as worker:
        wait_for(lambda: worker.runner is not None, 10, "the worker")
        for _ in range(4):
            q.add("t.other")
        add_suspect(redis, keys, "t.suspect")
        for _ in range(4):
            q.add("t.other")
        wait_for(lambda: len(beside) == 9, 20, "every job to run")
    assert [b for b in beside if "suspect" in b] == [["suspect"]], "the suspect ran with nothing beside it"


def test_a_suspect_whose_rate_token_lapsed_while_it_waited_to_run_alone_still_runs_and_frees_the_others(
        redis, redis_url):
    """It waits for a 0.4 s run to end before it runs alone, longer than its rate token's grace: it goes back to
    the loop late, takes a new token, runs alone, and the jobs held back behind it run after it. (The soak found
    a suspect that left this way without its turn ending: every job behind it waited until the worker stopped.)"""
    keys = QueueKeys.for_queue("suspects-rate")
    registry = HandlerRegistry()
    ran: list[str] = []
    slow_started = threading.Event()

    def slow() -> None:
        slow_started.set()
        threading.Event().wait(0.4)
        ran.append("slow")

    registry.register("t.slow", slow)
    registry.register("t.suspect", lambda: ran.append("suspect"))
    registry.register("t.other", lambda: ran.append("other"))
    q = Queue(keys.queue, url=redis_url)
    with worker_running(redis_url, [keys.queue], registry, concurrency=2,
                        limits={keys.queue: {"rate": "100/s"}}):
        q.add("t.slow")
        assert slow_started.wait(10)
        add_suspect(redis, keys, "t.suspect")
        for _ in range(3):
            q.add("t.other")
        wait_for(lambda: len(ran) == 5, 20, f"every job to run (ran: {ran})")
    assert sorted(ran) == ["other", "other", "other", "slow", "suspect"]
    assert ran.index("suspect") < min(i for i, name in enumerate(ran) if name == "other"), "the others waited"


def test_the_jobs_fetched_with_a_suspect_run_in_another_process_while_it_runs_alone(redis, redis_url):
    """A worker that keeps a suspect gives back what it fetched with it and reads nothing more until its suspects
    ran: the other worker runs those jobs meanwhile. Held behind suspects run one at a time, they used to wait for
    all of them (a crash storm on a loaded host left the soak's queues undrained that way)."""
    keys = QueueKeys.for_queue("suspects-give-back")
    registry = HandlerRegistry()
    ended: dict[str, float] = {}
    lock = threading.Lock()

    def job(name: str, seconds: float):
        def run(ctx) -> None:
            threading.Event().wait(seconds)
            with lock:
                ended[name if name == "suspect" else ctx.job.id] = time.monotonic()
        return run

    registry.register("t.suspect", job("suspect", 2.0), takes_context=True)
    registry.register("t.other", job("other", 0.02), takes_context=True)
    q = Queue(keys.queue, url=redis_url)
    add_suspect(redis, keys, "t.suspect")  # first in the stream: the first worker to read takes it with the others
    others = [q.add("t.other").job_id for _ in range(8)]
    with (worker_running(redis_url, [keys.queue], registry, concurrency=4, batch_size=50),
          worker_running(redis_url, [keys.queue], registry, concurrency=4, batch_size=50)):
        wait_for(lambda: len(ended) == 9, 30, "every job to run")
    late = [job_id for job_id in others if ended[job_id] > ended["suspect"]]
    assert not late, f"{len(late)} job(s) waited for the suspect to run alone instead of running elsewhere"
