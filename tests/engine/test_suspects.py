"""Suspects (jobs charged a run lost with a worker that died) run alone, and whatever path a suspect takes out of
the worker's hands, the jobs held back behind it go on."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import pytest

from bench.faultproxy import FaultProxy
from chasqui_core.engine.jobs.envelope import Job, error_record, new_job_id, now_ms
from chasqui_core.engine.recovery import ended_runs
from chasqui_core.engine.store.connection import is_cluster_client
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


def _late_suspect_setup(redis, keys: QueueKeys, url: str, slow, suspect):
    """A worker behind ``url`` with a rate limit; a 0.4 s sync job runs, then an async suspect is added: it waits
    longer than its rate token's grace to run alone, so it goes back for a new token when its turn comes."""
    registry = HandlerRegistry()
    slow_started = threading.Event()

    def slow_job() -> None:
        slow_started.set()
        threading.Event().wait(0.4)
        slow()

    registry.register("t.slow", slow_job, is_async=False)
    registry.register("t.suspect", suspect, is_async=True)
    worker = worker_running(url, [keys.queue], registry, concurrency=2, limits={keys.queue: {"rate": "100/s"}})
    return worker, slow_started


def _add_suspect_entry(redis, keys: QueueKeys) -> bytes:
    add_suspect(redis, keys, "t.suspect")
    return redis.xrevrange(keys.stream, count=1)[0][0]


def test_a_late_suspect_is_not_marked_running_while_it_waits_for_a_new_rate_token(redis, redis_url):
    """Marked running ahead of its start (it runs alone), a suspect whose token lapsed meanwhile does not start:
    its mark is struck while it takes a new token (noted on the host first, ended_runs.py), so a death of the
    process in that wait does not charge it a run it never began (the soak dead-lettered such a job as `panic`
    when a recycled process exited while the token could not be taken behind a blackholed link)."""
    keys = QueueKeys.for_queue("suspects-late-mark")
    server = urlsplit(redis_url)
    if is_cluster_client(redis) or server.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("the proxy forwards to one server, on loopback")
    ran: list[str] = []
    with FaultProxy(int(server.port or 6379)) as proxy:
        url = f"redis://{proxy.host}:{proxy.port}{server.path or '/0'}"

        async def suspect() -> None:
            ran.append("suspect")

        worker_block, slow_started = _late_suspect_setup(
            redis, keys, url, lambda: proxy.set_latency(0.5), suspect)  # the new token's round trip: a second
        with worker_block as worker:
            Queue(keys.queue, url=redis_url).add("t.slow")
            assert slow_started.wait(10)
            entry_id = _add_suspect_entry(redis, keys)
            journal = keys.running(worker.id)
            wait_for(lambda: entry_id in ended_runs.read(worker.id).get(journal, []) or "suspect" in ran, 10,
                     "the suspect's mark to be struck, or the suspect to run")
            assert "suspect" not in ran, "its mark was struck only once it ran: it stood while it waited"
            proxy.set_latency(0)
            wait_for(lambda: "suspect" in ran, 20, "the suspect to run with its new token")


def test_a_late_suspect_is_marked_again_before_it_starts_alone(redis, redis_url):
    """With its new token, the suspect is marked running before it starts, as on its first try: a job that
    kills its process before its first await is charged that death. The handler looks, blocking the loop (so
    no mark written after its start could land meanwhile), for its own mark."""
    keys = QueueKeys.for_queue("suspects-remark")
    seen: list[bool] = []
    state: dict[str, object] = {}

    async def suspect() -> None:
        journal, entry_id = state["journal"], state["entry"]
        for _ in range(100):  # no await: nothing else runs on the loop meanwhile
            if redis.hexists(journal, entry_id):
                break
            time.sleep(0.01)
        seen.append(bool(redis.hexists(journal, entry_id)))

    worker_block, slow_started = _late_suspect_setup(redis, keys, redis_url, lambda: None, suspect)
    with worker_block as worker:
        Queue(keys.queue, url=redis_url).add("t.slow")
        assert slow_started.wait(10)
        state["journal"] = keys.running(worker.id)
        state["entry"] = _add_suspect_entry(redis, keys)
        wait_for(lambda: bool(seen), 20, "the suspect to run")
    assert seen == [True], "not marked before it started alone"
