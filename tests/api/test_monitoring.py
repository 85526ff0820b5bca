"""/metrics (Prometheus) and /healthz, against a real server and a real worker."""

from __future__ import annotations

import socket
import time
from collections import Counter
from datetime import datetime, timedelta, UTC

import msgpack
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from chasqui_core.conf import load
from chasqui_core.engine.ops import stats, totals
from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.store.connection import is_cluster_client
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.api.helpers import ApiClient
from tests.helpers import info_per_server, worker_running

pytestmark = pytest.mark.django_db


def scrape(response) -> dict[tuple[str, tuple], float]:
    """Every sample of a /metrics answer: (name, sorted labels) -> value."""
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        assert family.documentation, f"{family.name} has no HELP text"
        assert family.name.startswith("chasqui_")
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


running_worker = worker_running
"""A real worker on its own thread and event loop, stopped on exit (tests/helpers.py)."""


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def workload_registry() -> HandlerRegistry:
    registry = HandlerRegistry()
    seen: set[int] = set()

    def ok(i):
        pass

    def flaky(i):
        if i not in seen:
            seen.add(i)
            raise ValueError("first run fails")

    def broken(i):
        raise ValueError("always fails")

    registry.register("ok", ok)
    registry.register("flaky", flaky, backoff=BackoffSpec.fixed(10))
    registry.register("broken", broken, max_attempts=2, backoff=BackoffSpec.fixed(10))
    return registry


# --- /metrics: values -----------------------------------------------------------------


def test_metrics_after_a_known_workload(redis, redis_url, view_api):
    q = Queue("mq", redis_client=redis)
    q.add_bulk([JobSpec("ok", [i]) for i in range(5)] + [JobSpec("flaky", [i]) for i in range(3)]
               + [JobSpec("broken", [i]) for i in range(2)])
    q.add_bulk([JobSpec("ok", [100 + i], delay=3_600_000) for i in range(2)])
    late = Queue("late", redis_client=redis)  # nobody serves it: its due job waits, so promotion lags
    late.add("ok", [1], run_at=datetime.now(UTC) - timedelta(seconds=5))
    Queue("idle", redis_client=redis).add("ok", [1])
    stats.pause(redis, "idle")

    with running_worker(redis_url, ["mq"], workload_registry(), concurrency=4):
        wait_for(lambda: totals.read_totals(redis, ["mq"])["mq"].counters["completed"] == 8
                 and redis.xlen(q.keys.dlq) == 2, 30, "the workload to finish")
        wait_for(lambda: stats.queue_stats(redis, "mq").pending == 0, 10, "the last settle")
        samples = scrape(view_api.get("/metrics"))

    def value(name, queue="mq", **labels):
        return samples[(name, tuple(sorted({"queue": queue, **labels}.items())))]

    assert value("chasqui_jobs_enqueued_total") == 12
    assert value("chasqui_jobs_completed_total") == 8
    assert value("chasqui_jobs_failed_total") == 3 + 4
    assert value("chasqui_jobs_retried_total") == 3 + 2
    assert value("chasqui_jobs_dead_lettered_total") == 2
    assert value("chasqui_jobs_promoted_total") == 5
    assert value("chasqui_jobs_replayed_total") == 0
    assert value("chasqui_jobs_fetched_total") == 10 + 5, "the ten ready jobs, then the five retries"
    assert (value("chasqui_runs_lost_total"), value("chasqui_jobs_recovered_total")) == (0, 0)
    assert value("chasqui_jobs_dead_lettered_by_reason_total", reason="retries_exhausted") == 2
    assert [labels for name, labels in samples if name == "chasqui_jobs_dead_lettered_by_reason_total"] == [
        (("queue", "mq"), ("reason", "retries_exhausted"))], "a reason never met is not listed"
    assert value("chasqui_queue_stream_length") == 0
    assert value("chasqui_queue_pending_jobs") == 0
    assert value("chasqui_queue_delayed_jobs") == 2
    assert value("chasqui_queue_dead_letter_jobs") == 2
    assert value("chasqui_queue_paused") == 0
    assert value("chasqui_queue_workers_alive") == 1
    assert value("chasqui_promoter_lag_seconds") == 0

    for task, runs in {"ok": 5, "flaky": 6, "broken": 4}.items():
        assert value("chasqui_job_duration_seconds_count", task=task) == runs
        assert value("chasqui_job_duration_seconds_bucket", task=task, le="+Inf") == runs
        assert value("chasqui_job_duration_seconds_sum", task=task) >= 0
        buckets = [v for (name, labels), v in samples.items()
                   if name == "chasqui_job_duration_seconds_bucket" and ("task", task) in labels
                   and ("queue", "mq") in labels]
        assert len(buckets) == len(totals.DURATION_BOUNDS_MS) + 1
    assert value("chasqui_job_duration_seconds_bucket", task="ok", le="300.0") == 5

    assert value("chasqui_queue_paused", queue="idle") == 1
    assert value("chasqui_queue_stream_length", queue="idle") == 1
    assert value("chasqui_jobs_enqueued_total", queue="idle") == 1
    assert value("chasqui_queue_workers_alive", queue="idle") == 0
    assert 4 <= value("chasqui_promoter_lag_seconds", queue="late") < 120
    assert value("chasqui_queue_delayed_jobs", queue="late") == 1
    assert {labels for name, labels in samples if name == "chasqui_queue_paused"} == {
        (("queue", name),) for name in ("idle", "late", "mq")}

    dead = DeadLetters(redis, "mq")
    assert dead.replay([dead.page(limit=1).items[0].entry_id]) == 1
    after = scrape(view_api.get("/metrics"))
    assert after[("chasqui_jobs_replayed_total", (("queue", "mq"),))] == 1


def test_metrics_of_schedules_after_their_fires(redis, redis_url, view_api, settings):
    """Fires, misses, pause and the next fire of each schedule, as the scheduler recorded them."""
    import asyncio

    from chasqui_core import schedules
    from chasqui_core.engine.store.connection import aconnect
    from chasqui_core.engine.store.keys import schedule_state
    from chasqui_core.engine.timing.scheduler import Scheduler, queue_fire, set_paused
    from chasqui_core.engine.store.scripts import Scripts

    settings.CHASQUI = {"SCHEDULES": {
        "hourly": {"task": "tests.django.sample_tasks.add", "every": 3600, "args": [1, 2], "grace": 0,
                   "misfire": "run_all", "catch_up": 2},
        "nightly": {"task": "tests.django.sample_tasks.add", "cron": "0 3 * * *", "args": [1, 2]},
    }}
    found = list(schedules.configured().values())

    async def tick():
        client = aconnect(redis_url)
        runner = Scheduler(client, Scripts(client), found, queue_fire(redis_url), "leader")
        await runner._acquire_or_renew()
        await runner.tick()
        await runner.release()
        await client.aclose()

    asyncio.run(tick())  # the first look computes each next due time
    seconds, _ = redis.time()
    this_hour = seconds // 3600 * 3600 * 1000
    redis.hset(schedule_state("hourly"), "next", this_hour - 4 * 3600 * 1000)  # five due times passed
    asyncio.run(tick())
    set_paused(redis, "nightly", "vera")

    samples = scrape(view_api.get("/metrics"))
    hourly = (("queue", "default"), ("schedule", "hourly"))
    nightly = (("queue", "default"), ("schedule", "nightly"))
    assert samples[("chasqui_schedule_fires_total", hourly)] == 2
    assert samples[("chasqui_schedule_missed_total", hourly)] == 3
    assert samples[("chasqui_schedule_next_fire_timestamp_seconds", hourly)] == this_hour / 1000 + 3600
    assert samples[("chasqui_schedule_paused", hourly)] == 0
    assert samples[("chasqui_schedule_paused", nightly)] == 1
    assert ("chasqui_schedule_next_fire_timestamp_seconds", nightly) not in samples
    assert samples[("chasqui_schedule_last_fire_timestamp_seconds", hourly)] >= this_hour / 1000


def test_metrics_carry_lost_runs_recovered_jobs_and_dead_letters_per_reason(redis, view_api):
    keys = QueueKeys.for_queue("fleet")
    redis.sadd(QUEUES_REGISTRY, "fleet")
    # what reclaim.lua and settle.lua leave after two deaths of a poison pill among its neighbours
    redis.hset(keys.totals, mapping={"lost": 2, "recovered": 7, "fetched": 40, "dlq": 3, "dlq:panic": 1,
                                     "dlq:retries_exhausted": 2})
    samples = scrape(view_api.get("/metrics"))

    def value(name, **labels):
        return samples[(name, tuple(sorted({"queue": "fleet", **labels}.items())))]

    assert (value("chasqui_runs_lost_total"), value("chasqui_jobs_recovered_total")) == (2, 7)
    assert value("chasqui_jobs_fetched_total") == 40
    assert value("chasqui_jobs_dead_lettered_total") == 3
    assert value("chasqui_jobs_dead_lettered_by_reason_total", reason="panic") == 1
    assert value("chasqui_jobs_dead_lettered_by_reason_total", reason="retries_exhausted") == 2


def test_metrics_with_no_queue_is_empty_but_valid(view_api):
    assert scrape(view_api.get("/metrics")) == {}


def test_metrics_of_a_hundred_queues_read_a_fixed_set_of_keys_per_queue(redis, view_api):
    pipe = redis.pipeline(transaction=False)
    for i in range(100):
        pipe.sadd(QUEUES_REGISTRY, f"q{i}")
        pipe.hincrby(QueueKeys.for_queue(f"q{i}").totals, "enqueued", i)
    pipe.execute()
    if is_cluster_client(redis):  # a cluster client's first use opens a few connections: the layout, COMMAND...
        scrape(view_api.get("/metrics"))
    before = _connections(redis)
    calls_before = _commands(redis)
    samples = scrape(view_api.get("/metrics"))
    assert samples[("chasqui_jobs_enqueued_total", (("queue", "q42"),))] == 42
    assert len([1 for name, _ in samples if name == "chasqui_jobs_enqueued_total"]) == 100
    # the registry once, then per queue the same reads (sent in one pipeline): none per job or per worker
    calls = _commands(redis) - calls_before
    assert calls["smembers"] == 1 + 100, calls  # the registry, and each queue's priority bands (none here)
    assert calls["scard"] == 100, calls  # limit buckets in use: none here, so no more reads
    assert calls["hgetall"] == 300, calls  # workers, totals, durations
    # the delayed set's figures per queue (and, on a cluster, the clock: a pipeline there cannot carry TIME)
    clock = 1 if is_cluster_client(redis) else 0
    assert calls["xlen"] == 200 and calls["exists"] == 100 and calls["eval"] == 100 + clock, calls
    assert all(now - then <= 1 for now, then in zip(_connections(redis), before, strict=True))


def test_metrics_sum_a_queues_priority_bands_and_give_each_bands_waiting_jobs(redis, view_api):
    q = Queue("banded", redis_client=redis)
    for priority, n in ((20, 3), (0, 2), (-20, 4)):
        q.add_bulk([JobSpec("ok", [i], priority=priority) for i in range(n)])
    Queue("flat", redis_client=redis).add("ok", [1])
    keys = QueueKeys.for_queue("banded")
    redis.xreadgroup("chasqui", "w-1", {keys.in_band("high").stream: ">"}, count=1)
    samples = scrape(view_api.get("/metrics"))
    assert samples[("chasqui_queue_stream_length", (("queue", "banded"),))] == 9
    assert samples[("chasqui_queue_pending_jobs", (("queue", "banded"),))] == 1
    bands = {dict(labels)["band"]: v for (name, labels), v in samples.items()
             if name == "chasqui_queue_band_waiting_jobs" and ("queue", "banded") in labels}
    assert bands == {"high": 2, "default": 2, "low": 4}
    assert not [1 for name, labels in samples if name == "chasqui_queue_band_waiting_jobs"
                and ("queue", "flat") in labels], "a queue without bands has no band figures"


def _commands(redis) -> Counter[str]:
    """Calls per command since the server started, summed over a cluster's masters."""
    out: Counter[str] = Counter()
    for server in info_per_server(redis, "commandstats"):
        out.update({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in server.items()})
    return out


def _connections(redis) -> list[int]:
    """Connections each server (each master of a cluster) has accepted since it started."""
    return [int(server["total_connections_received"]) for server in info_per_server(redis, "stats")]


# --- /metrics: access ----------------------------------------------------------------------


def test_metrics_refuse_anonymous_callers(anon_api):
    response = anon_api.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "view_queues" in response.content.decode()


def test_metrics_refuse_a_key_without_the_view_permission(outsider_api):
    response = outsider_api.get("/metrics")
    assert response.status_code == 403
    assert "view_queues" in response.content.decode()


def test_metrics_refuse_a_wrong_key(db):
    response = Client(headers={"authorization": "Bearer not-a-key"}).get("/metrics")
    assert response.status_code == 401


def test_metrics_answer_a_key_with_the_view_permission(view_api, redis):
    Queue("k", redis_client=redis).add("ok", [1])
    samples = scrape(view_api.get("/metrics"))
    assert samples[("chasqui_jobs_enqueued_total", (("queue", "k"),))] == 1


@override_settings(API_KEY_FAILURE_LIMIT=2)
def test_wrong_keys_on_metrics_count_against_the_api_limit(view_api):
    wrong = Client(headers={"authorization": "Bearer not-a-key"})
    assert [wrong.get("/metrics").status_code for _ in range(2)] == [401, 401]
    blocked = wrong.get("/metrics")
    assert blocked.status_code == 429 and int(blocked["Retry-After"]) >= 1
    assert ApiClient("not-a-key").get("/api/queues").status_code == 429, "the API shares the count"
    assert view_api.get("/api/queues").status_code == 200, "a right key is served whatever the count"


def test_metrics_answer_allowed_addresses_without_a_key(redis):
    Queue("ip", redis_client=redis).add("ok", [1])
    with override_settings(CHASQUI={"METRICS_ALLOWED_IPS": ["10.1.0.0/16", "192.0.2.7"]}):
        assert Client(REMOTE_ADDR="10.1.200.3").get("/metrics").status_code == 200
        assert scrape(Client(REMOTE_ADDR="192.0.2.7").get("/metrics"))[
            ("chasqui_jobs_enqueued_total", (("queue", "ip"),))] == 1
        assert Client(REMOTE_ADDR="10.2.0.1").get("/metrics").status_code == 401
        assert Client(REMOTE_ADDR="192.0.2.8").get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR="192.0.2.7").get("/metrics").status_code == 401, "nobody is allowed by default"


@pytest.mark.parametrize("value, words", [
    ("10.0.0.1", "must be a list"),
    (["10.0.0.1/8"], "host bits"),
    (["prometheus.internal"], "not an IP address or network"),
])
def test_allowed_addresses_are_checked_when_settings_load(value, words):
    with pytest.raises(ImproperlyConfigured, match=words):
        load({"METRICS_ALLOWED_IPS": value})


# --- /healthz --------------------------------------------------------------------------------


def test_healthz_is_ok_with_a_promoter_leader(redis, redis_url, anon_api):
    with running_worker(redis_url, ["hq"], workload_registry(), promoter_lock_ttl_ms=5000) as worker:
        wait_for(lambda: redis.exists(QueueKeys.for_queue("hq").promoter_lock), 10, "a promoter leader")
        wait_for(lambda: redis.hexists(QueueKeys.for_queue("hq").workers, worker.id), 10, "a heartbeat")
        response = anon_api.get("/healthz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok" and body["redis"] == "ok"
    assert body["queues"]["hq"] == {"workers": 1, "promoter_leader": True, "leaderless_for_s": 0}


def _beat(redis, queue: str, worker_id: str) -> None:
    """A fresh heartbeat, as a live worker leaves it, for a worker whose promoter never took the lock."""
    seconds, micros = redis.time()
    now = seconds * 1000 + micros // 1000
    redis.sadd(QUEUES_REGISTRY, queue)
    redis.hset(QueueKeys.for_queue(queue).workers, worker_id,
               msgpack.packb({"id": worker_id, "queues": [queue], "last_seen": now, "started_at": now}))


def test_healthz_fails_once_a_served_queue_has_no_leader_for_longer_than_the_lock_ttl(redis, anon_api):
    with override_settings(CHASQUI={"PROMOTER_LOCK_TTL_MS": 300}):
        _beat(redis, "stuck", "w-stuck")
        first = anon_api.get("/healthz")
        assert first.status_code == 200, "a leader may be missing for a moment while another is elected"
        assert first.json()["queues"]["stuck"]["promoter_leader"] is False
        time.sleep(0.4)
        _beat(redis, "stuck", "w-stuck")
        later = anon_api.get("/healthz")
    assert later.status_code == 503, later.content
    body = later.json()
    assert body["status"] == "unavailable" and body["redis"] == "ok"
    assert "'stuck' has had no promoter leader" in body["reason"]
    assert body["queues"]["stuck"]["leaderless_for_s"] >= 0.3


def test_healthz_ignores_queues_nobody_serves(redis, anon_api):
    redis.sadd(QUEUES_REGISTRY, "retired")
    response = anon_api.get("/healthz")
    assert response.status_code == 200
    assert response.json()["queues"]["retired"] == {"workers": 0, "promoter_leader": False, "leaderless_for_s": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthz_fails_fast_when_redis_is_unreachable(anon_api):
    with override_settings(CHASQUI={"REDIS_URL": f"redis://127.0.0.1:{_free_port()}/0"}):
        started = time.monotonic()
        response = anon_api.get("/healthz")
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and "did not answer" in body["redis"]
    assert body["reason"] == body["redis"]
    assert elapsed < 10


def test_healthz_answers_in_time_when_redis_hangs(anon_api):
    """A server that accepts connections and never replies: the check gives up on its own timeouts."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # connections complete in the kernel; nothing ever reads or answers
        url = f"redis://127.0.0.1:{hung.getsockname()[1]}/0"
        with override_settings(CHASQUI={"REDIS_URL": url}):
            started = time.monotonic()
            response = anon_api.get("/healthz")
            elapsed = time.monotonic() - started
    assert response.status_code == 503
    assert "TimeoutError" in response.json()["redis"]
    assert elapsed < 10, f"took {elapsed:.1f} s"


def test_metrics_carry_the_workflow_counters(redis, view_api):
    keys = QueueKeys.for_queue("flows-fleet")
    redis.sadd(QUEUES_REGISTRY, "flows-fleet")
    redis.hset(keys.totals, mapping={"batches_started": 5, "batches_succeeded": 3, "batches_completed": 4,
                                     "callbacks": 6})
    samples = scrape(view_api.get("/metrics"))

    def value(name):
        return samples[(name, (("queue", "flows-fleet"),))]

    assert [value(f"chasqui_{name}_total") for name in ("batches_started", "batches_succeeded",
                                                          "batches_completed", "workflow_callbacks")] == [5, 3, 4, 6]
