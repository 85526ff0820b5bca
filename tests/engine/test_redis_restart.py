"""Workers and a Redis that restarts under them: each process resumes within seconds, nothing lost or run twice.

The server is a private Valkey with an append-only file (fsync on every
write, as a production server that must lose nothing), filled with enough
keys that reloading it takes a moment: a restarted server accepts
connections but answers ``LOADING`` until it has read its file, which is
where readers used to die silently. It is restarted three times, at
different moments: while the workers wait on an empty queue, just after a
burst of jobs was added, and while slow jobs run. Two worker processes
serve two queues; their handlers record each run on another server (the
tests' own), which never restarts.
"""

import time

import pytest

from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.store.embedded import EmbeddedValkey
from chasqui_core.engine.producer.queue import Queue
from tests.engine.worker_app import Workers, read_runs, runs_by_job, settled, wait_for

QUEUES = ("restart-a", "restart-b")


def restart(server: EmbeddedValkey) -> None:
    server.stop()
    server.start(timeout=60)


def fill(client, keys: int) -> None:
    """Enough data that loading the append-only file takes a while: the window in which the server says LOADING."""
    client.execute_command("DEBUG", "POPULATE", keys, "filler", 64)
    client.bgrewriteaof()
    wait_for(lambda: int(client.info("persistence")["aof_rewrite_in_progress"]) == 0
             and int(client.info("persistence")["aof_rewrite_scheduled"]) == 0, 60, "the AOF rewrite")


@pytest.mark.timeout(240)
def test_every_worker_resumes_after_each_redis_restart_and_each_job_runs_once(redis, redis_url, tmp_path):
    server = EmbeddedValkey(tmp_path / "data", appendonly=True,
                            extra_args=["--appendfsync", "always", "--enable-debug-command", "local"])
    url = server.start()
    workers = Workers(url, tmp_path)
    try:
        admin = connect(url)
        fill(admin, 300_000)
        procs = [workers.start(list(QUEUES), record_url=redis_url, concurrency=2, batch_size=2,
                               visibility_ms=5000, block_ms=500) for _ in range(2)]
        workers.wait_ready(admin, QUEUES[0], 2)
        producers = [Queue(name, url=url, retry_for=60) for name in QUEUES]
        added: list[str] = []

        def burst(n: int, task: str = "noop", **kwargs) -> list[str]:
            ids = [producers[i % 2].add(task, kwargs=kwargs).job_id for i in range(n)]
            added.extend(ids)
            return ids

        def resumed(ids: list[str], what: str) -> None:
            """Every job of ``ids`` ran, and both processes ran some of them: neither is silent.

            Forty jobs of 0.2 s, four at most held per process, take one process alone 4 s: longer than
            a reader's longest wait between tries (2 s), so a process that resumed at all runs some.
            """
            def done():
                by_job = runs_by_job(read_runs(redis))
                return all(i in by_job for i in ids) and {by_job[i][0].pid for i in ids}
            pids = wait_for(done, 45, what)
            assert pids == {p.pid for p in procs}, f"{what}: only {pids} ran jobs ({workers.logs()})"

        resumed(burst(40, "block", seconds=0.2), "the first jobs")
        restart(server)  # 1. while the workers wait on empty queues
        resumed(burst(40, "block", seconds=0.2), "jobs after a restart at rest")
        burst(400)
        restart(server)  # 2. just after a burst, as it is read
        resumed(burst(40, "block", seconds=0.2), "jobs after a restart during a burst")
        burst(20, "block", seconds=0.5)
        time.sleep(0.3)
        restart(server)  # 3. while slow jobs run
        resumed(burst(40, "block", seconds=0.2), "jobs after a restart during slow jobs")

        wait_for(lambda: all(settled(admin, q) for q in QUEUES), 60, "both queues to settle")
        by_job = runs_by_job(read_runs(redis))
        assert sorted(by_job) == sorted(added), "every job ran"
        twice = {job_id: runs for job_id, runs in by_job.items() if len(runs) > 1}
        assert twice == {}, "no job ran twice"
        assert all(admin.xlen(f"{{chasqui:{q}}}:dlq") == 0 for q in QUEUES)
        assert all(p.poll() is None for p in procs), "no worker process died"
    finally:
        workers.close()
        server.stop()


def test_a_worker_started_while_redis_is_unreachable_says_so_in_a_line_and_starts_once_it_answers(
        tmp_path, caplog):
    import threading

    from chasqui_core.engine.store.embedded import free_port
    from chasqui_core.engine.jobs.registry import HandlerRegistry
    from chasqui_core.engine.worker.worker import Worker

    port = free_port()
    ran = threading.Event()
    registry = HandlerRegistry()
    registry.register("t", ran.set)
    url = f"redis://127.0.0.1:{port}/0"
    worker = Worker(["unreachable"], registry, url=url, install_signal_handlers=False, block_ms=50)
    thread = threading.Thread(target=worker.run_sync, daemon=True)
    caplog.set_level("WARNING", logger="chasqui.worker")
    thread.start()
    server = EmbeddedValkey(tmp_path / "data", port=port, appendonly=False)
    try:
        wait_for(lambda: "cannot be reached" in caplog.text, 10, "the worker to say Redis cannot be reached")
        assert thread.is_alive(), "it keeps trying instead of exiting"
        [line] = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()][:1]
        assert url in line  # named (with any password masked: connection.masked)
        assert "Traceback" not in caplog.text
        server.start()
        Queue("unreachable", url=url).add("t")
        assert ran.wait(30), "the worker never ran the job once Redis answered"
    finally:
        worker.request_stop()
        thread.join(30)
        server.stop()
    assert not thread.is_alive()
