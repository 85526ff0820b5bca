"""Execution idempotency with real workers: a job whose key already completed is acknowledged, not run.

Workers run as separate processes (tests/engine/worker_app.py); their handlers
record every run in a Redis list, which is how these tests see what ran.
"""

from __future__ import annotations

import time

import msgpack
import pytest

from chasqui_core.engine.jobs import events
from chasqui_core.engine.ops import totals
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.idempotency import DEFAULT_TTL, IDEMPOTENCY_KEY, IDEMPOTENCY_TTL
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.envelope import decode
from tests.engine.worker_app import dlq_entries, read_runs, settled, wait_for
from tests.helpers import info_per_server, reset_stats


def _result(redis, keys: QueueKeys, job_id: str) -> dict:
    return msgpack.unpackb(redis.get(keys.result + job_id))


def test_keys_and_lifetimes_are_checked_and_true_means_the_job_id(redis):
    queue = Queue("idem-build", redis_client=redis, idempotency_ttl=3600)
    job = decode(queue.build(JobSpec("echo", job_id="invoice-7", idempotency_key=True)).payload)
    assert job.meta == {IDEMPOTENCY_KEY: "invoice-7", IDEMPOTENCY_TTL: 3600}
    job = decode(queue.build(JobSpec("echo", idempotency_key="order-42", idempotency_ttl=60)).payload)
    assert job.meta == {IDEMPOTENCY_KEY: "order-42", IDEMPOTENCY_TTL: 60}
    assert decode(queue.build(JobSpec("echo", idempotency_key=False)).payload).meta == {}
    for bad, words in (({"idempotency_key": ""}, "non-empty string"), ({"idempotency_key": 42}, "non-empty string"),
                       ({"idempotency_key": "k" * 201}, "at most 200"),
                       ({"idempotency_key": "k", "idempotency_ttl": 0}, "from 1 to"),
                       ({"idempotency_ttl": 60}, "only meaningful with an idempotency_key"),
                       ({"meta": {IDEMPOTENCY_KEY: "k"}}, "the queue's own")):
        with pytest.raises(ValueError, match=words):
            queue.add("echo", **bad)
    with pytest.raises(ValueError, match="idempotency_ttl must be"):
        Queue("idem-build", redis_client=redis, idempotency_ttl=-1)
    assert redis.xlen(QueueKeys.for_queue("idem-build").stream) == 0


@pytest.mark.timeout(90)
def test_a_duplicate_of_a_completed_key_is_acknowledged_without_running(redis, workers):
    workers.start("idem")
    workers.wait_ready(redis, "idem", 1)
    keys = QueueKeys.for_queue("idem")
    queue = Queue("idem", redis_client=redis)
    first = queue.add("echo", ["charged"], idempotency_key="order-42", result_ttl=60)
    wait_for(lambda: settled(redis, "idem") and read_runs(redis), 20, "the first job to run")
    assert redis.get(keys.done + "order-42").decode() == first.job_id
    assert 0 < redis.pttl(keys.done + "order-42") <= DEFAULT_TTL * 1000

    # the caller did not see the first reply and adds the same work again, under a new id
    again = queue.add("echo", ["charged"], idempotency_key="order-42", result_ttl=60)
    other = queue.add("slow", [0], idempotency_key="order-43", idempotency_ttl=60)  # async, never completed
    plain = queue.add("echo", ["no key"])
    wait_for(lambda: len(read_runs(redis)) >= 3, 20, "the other jobs to run")
    wait_for(lambda: settled(redis, "idem"), 10, "the queue to settle")
    time.sleep(0.3)  # a duplicate run would land now

    assert sorted(r.job_id for r in read_runs(redis)) == sorted([first.job_id, other.job_id, plain.job_id])
    assert 0 < redis.pttl(keys.done + "order-43") <= 60_000
    counted = totals.read_totals(redis, ["idem"])["idem"].counters
    assert counted["skipped"] == 1 and counted["completed"] == 3 and counted["dlq"] == 0
    _, seen = events.read_events(redis, "idem")
    [skip] = [e for e in seen if e.type == events.SKIPPED]
    assert (skip.job_id, skip.task) == (again.job_id, "echo")
    assert skip.extra == {"idempotency_key": "order-42", "completed_by": first.job_id}
    assert f"not run: its idempotency key 'order-42' was completed by job {first.job_id}" in workers.logs()
    # get_result(): the duplicate reports the work done, naming who did it; the original keeps its value
    duplicate = _result(redis, keys, again.job_id)
    assert duplicate["status"] == "SUCCESSFUL" and duplicate["duplicate_of"] == first.job_id
    assert duplicate["return_value"] is None and duplicate["started_at"] is None
    assert _result(redis, keys, first.job_id)["return_value"] == "charged"


@pytest.mark.timeout(90)
def test_replaying_a_dead_copy_runs_only_when_its_key_never_completed(redis, workers):
    workers.start("idem-replay")
    workers.wait_ready(redis, "idem-replay", 1)
    keys = QueueKeys.for_queue("idem-replay")
    queue = Queue("idem-replay", redis_client=redis)
    # two pieces of work whose first copies died
    dead_done = queue.add("unrecoverable", idempotency_key="invoice-7")
    dead_open = queue.add("unrecoverable", idempotency_key="invoice-8")
    wait_for(lambda: redis.xlen(keys.dlq) == 2, 20, "both copies to die")
    # invoice-7 was then done by another copy
    done = queue.add("echo", ["invoice 7"], idempotency_key="invoice-7")
    wait_for(lambda: redis.exists(keys.done + "invoice-7"), 20, "invoice-7 to complete")

    dlq = DeadLetters(redis, "idem-replay")
    assert dlq.replay([d.entry_id for d in dlq.page(limit=10).items]) == 2
    wait_for(lambda: redis.xlen(keys.dlq) == 1 and settled(redis, "idem-replay"), 20, "the replays to settle")
    time.sleep(0.3)

    runs = [r.job_id for r in read_runs(redis)]
    assert runs.count(dead_done.job_id) == 1, "the copy of completed work is not run again"
    assert runs.count(dead_open.job_id) == 2, "work never completed runs when replayed"
    assert runs.count(done.job_id) == 1
    [again] = dlq_entries(redis, "idem-replay")
    assert again["job_id"].decode() == dead_open.job_id and again["reason"] == b"unrecoverable"
    assert totals.read_totals(redis, ["idem-replay"])["idem-replay"].counters["skipped"] == 1


@pytest.mark.timeout(90)
def test_a_copy_redelivered_after_a_worker_died_is_not_run_when_its_key_completed(redis, workers):
    keys = QueueKeys.for_queue("idem-crash")
    queue = Queue("idem-crash", redis_client=redis)
    # the work is done once, by a worker that then stops cleanly
    first = workers.start("idem-crash")
    workers.wait_ready(redis, "idem-crash", 1)
    built = queue.build(JobSpec("echo", ["done once"], job_id="report-2024-06", idempotency_key=True, result_ttl=60))
    queue.add_built(built)
    wait_for(lambda: settled(redis, "idem-crash") and read_runs(redis), 20, "the job to run")
    first.terminate()
    assert first.wait(30) == 0

    # the same envelope delivered again (an earlier copy), and a job never completed, both held by a worker that
    # died: pending in the consumer group, for a consumer that will never settle them
    redis.xadd(keys.stream, {"j": built.payload})
    unfinished = queue.add("echo", ["never finished"], idempotency_key="report-2024-07")
    redis.xreadgroup(GROUP, "a-worker-that-died", {keys.stream: ">"}, count=10)
    assert redis.xpending(keys.stream, GROUP)["pending"] == 2
    time.sleep(1.2)  # idle past the next worker's visibility timeout

    workers.start("idem-crash", visibility_ms=1000)
    wait_for(lambda: settled(redis, "idem-crash") and len(read_runs(redis)) >= 2, 30, "the reclaimed entries")
    time.sleep(0.3)
    assert [r.job_id for r in read_runs(redis)] == [built.job_id, unfinished.job_id]
    assert _result(redis, keys, built.job_id)["return_value"] == "done once", "the completing run's record stays"
    assert "completed by this same job" in workers.logs()
    assert dlq_entries(redis, "idem-crash") == []


@pytest.mark.timeout(90)
def test_the_check_costs_one_round_trip_per_batch_of_keyed_jobs_and_none_without(redis, workers):
    reset_stats(redis)
    workers.start("idem-cost", batch_size=100)
    workers.wait_ready(redis, "idem-cost", 1)
    queue = Queue("idem-cost", redis_client=redis)

    def mget_calls() -> int:  # on every master of a cluster
        return sum(int(s.get("cmdstat_mget", {}).get("calls", 0)) for s in info_per_server(redis, "commandstats"))

    queue.add_bulk([JobSpec("noop", [i]) for i in range(300)])
    wait_for(lambda: len(read_runs(redis)) >= 300 and settled(redis, "idem-cost"), 30, "300 plain jobs")
    assert mget_calls() == 0

    queue.add_bulk([JobSpec("noop", [i], idempotency_key=f"k{i}") for i in range(300)])
    wait_for(lambda: len(read_runs(redis)) >= 600 and settled(redis, "idem-cost"), 30, "300 keyed jobs")
    assert 1 <= mget_calls() <= 30, "one MGET per fetched batch, not one per job"
