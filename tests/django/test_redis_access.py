"""TLS and ACL users, for real: certificates made at test time, the ACL rules docs/cluster.md gives.

Servers are started here (tests/clusters.py): one speaking TLS only with
client certificates required, a TLS cluster, and a cluster with the three
users of docs/cluster.md on every node. The ACL test runs a producer, a
worker and the console's reads and actions as those users, then reads every
node's ``ACL LOG``: a refusal a process swallowed (a worker's housekeeping
logs and carries on) still fails the test.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import time
from collections import Counter

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from chasqui_core.engine.ops import control, history, metrics, running_jobs, stats, totals, waiting
from chasqui_core.engine.timing import delayed, scheduler
from chasqui_core.engine.worker import limits
from chasqui_core.engine.dlq.estimate import estimate_matching
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.search import TextSearch
from chasqui_core.engine.store.connection import connect, forget, is_cluster_client, masked
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.store.embedded import EmbeddedCluster
from chasqui_core.engine.jobs.errors import RedisConfigError, UnrecoverableError
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.timing.schedules import Schedule
from chasqui_core.engine.store.scripts import Scripts
from tests.clusters import TLSServer, make_certificates, queues_on_each_master, server_binary, tls_support
from tests.engine.worker_app import wait_for
from tests.helpers import ROOT, WorkerThread

pytestmark = pytest.mark.timeout(120)

ROLES = ("producer", "worker", "console")


def documented_acl_rules() -> dict[str, str]:
    """The ``ACL SETUSER chasqui-<role> ...`` lines of docs/cluster.md, by role."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    rules = dict(re.findall(r"^ACL SETUSER chasqui-(\w+) (.+)$", text, flags=re.MULTILINE))
    assert set(rules) == set(ROLES), f"docs/cluster.md should give one ACL SETUSER line per role, found {set(rules)}"
    return rules


async def _add_async(queue: Queue, task: str, args: list) -> None:
    await queue.aadd(task, args)
    await queue.aclose()


def registry_recording(runs: Counter) -> HandlerRegistry:
    registry = HandlerRegistry()

    def ok(tag: str) -> None:
        runs[tag] += 1

    async def slow(tag: str) -> None:  # outlives a third of the visibility timeout: its lease is renewed
        await asyncio.sleep(1.0)
        runs[tag] += 1

    def broken(tag: str) -> None:
        runs[tag] += 1
        raise UnrecoverableError("never works")

    registry.register("ok", ok)
    registry.register("slow", slow)
    registry.register("broken", broken)
    return registry


# --- TLS -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make test certificates with")
    if why := tls_support():
        pytest.skip(why)
    return make_certificates(tmp_path_factory.mktemp("certificates"))


def test_a_tls_server_with_client_certificates_takes_jobs_and_runs_them(certificates, tmp_path):
    server = TLSServer(tmp_path / "tls", certificates)
    url = server.start()
    try:
        with pytest.raises(redis.ConnectionError):  # plain TCP is not spoken there
            redis.Redis(port=server.port, socket_connect_timeout=1).ping()
        queue = Queue("tls", url=url)
        queue.add_bulk([JobSpec("ok", [f"sync-{i}"]) for i in range(20)])
        asyncio.run(_add_async(queue, "ok", ["async"]))
        runs: Counter[str] = Counter()
        worker = WorkerThread(["tls"], registry_recording(runs), url)
        try:
            wait_for(lambda: len(runs) == 21, 30, "the jobs added over TLS to run")
        finally:
            worker.stop()
        queue.close()
    finally:
        server.stop()


def test_a_tls_cluster_takes_jobs_on_every_master(certificates, tmp_path):
    with EmbeddedCluster(tmp_path / "tls-cluster", masters=3, binary=server_binary(), tls=True,
                         extra_args=certificates.server_args(cluster=True),
                         client_kwargs=certificates.client_kwargs()) as cluster:
        url = f"{cluster.url}?{certificates.query()}"
        client = connect(url)
        names = queues_on_each_master(client)
        for name in names:
            Queue(name, redis_client=client).add_bulk([JobSpec("ok", [f"{name}-{i}"]) for i in range(10)])
        runs: Counter[str] = Counter()
        worker = WorkerThread(names, registry_recording(runs), url)
        try:
            wait_for(lambda: len(runs) == 30, 30, "the jobs on three TLS masters to run")
        finally:
            worker.stop()
        assert stats.list_queues(client) == names
        client.close()


def test_a_tls_file_that_is_not_there_is_named_at_start(settings):
    url = "rediss://127.0.0.1:6390/0?ssl_ca_certs=/nowhere/ca.pem"
    with pytest.raises(RedisConfigError, match=r"ssl_ca_certs names '/nowhere/ca.pem', which does not exist"):
        connect(url)
    settings.CHASQUI = {"REDIS_URL": url}
    from chasqui_core.checks import redis_url
    from tests.django import sample_tasks

    [error] = redis_url()  # what `manage.py check` and runworker report, naming the setting
    assert error.id == "chasqui.E003"
    assert re.match(r"settings.CHASQUI\['REDIS_URL'\]: .*ssl_ca_certs", error.msg)
    with pytest.raises(ImproperlyConfigured, match=r"settings.CHASQUI\['REDIS_URL'\]: .*ssl_ca_certs"):
        sample_tasks.add.enqueue(1, 2)  # a process that ran no checks: its first connection says the same


# --- ACL ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    """A 3-master cluster with the documented users on every node; yields (cluster, {role: url})."""
    rules = documented_acl_rules()
    with EmbeddedCluster(tmp_path_factory.mktemp("acl-cluster"), masters=3, binary=server_binary()) as cluster:
        first = cluster.client(cluster.ports[0])
        try:  # a server that knows CLIENT SETINFO (7.2+, Valkey) gets it, as docs/cluster.md says
            first.execute_command("ACL", "SETUSER", "chasqui-probe", "+client|setinfo")
            first.execute_command("ACL", "DELUSER", "chasqui-probe")
            rules = {role: rule + " +client|setinfo" for role, rule in rules.items()}
        except redis.ResponseError:
            pass
        first.close()
        urls = {}
        for role, rule in rules.items():
            password = secrets.token_hex(8)
            for port in cluster.ports:
                node = cluster.client(port)
                node.execute_command("ACL", "SETUSER", f"chasqui-{role}",
                                     *rule.replace(">PASSWORD", f">{password}").split())
                node.close()
            urls[role] = f"redis://chasqui-{role}:{password}@127.0.0.1:{cluster.ports[0]}/0"
        yield cluster, urls


def acl_refusals(cluster) -> list[dict]:
    out = []
    for port in cluster.ports:
        node = cluster.client(port)
        out += node.acl_log()
        node.close()
    return out


def test_the_documented_acl_users_can_do_their_work_and_nothing_is_refused(acl_cluster):
    cluster, urls = acl_cluster
    admin = connect(cluster.url)
    admin.flushdb(target_nodes=admin.PRIMARIES)
    for port in cluster.ports:
        node = cluster.client(port)
        node.acl_log_reset()
        node.close()
    names = queues_on_each_master(admin)

    # producer: every kind of add, sync and async, on every master
    producer = connect(urls["producer"])
    for name in names:
        queue = Queue(name, redis_client=producer)
        queue.add("ok", [f"{name}:one"])
        queue.add("ok", [f"{name}:keyed"], job_id=f"{name}-keyed")
        queue.add_bulk([JobSpec("ok", [f"{name}:{i}"]) for i in range(20)])
        queue.add("ok", [f"{name}:later"], delay=300)
        queue.add("slow", [f"{name}:slow"])
        queue.add("broken", [f"{name}:broken"])
        queue.add("ok", [f"{name}:idempotent"], idempotency_key=f"{name}-once")  # its batch's markers are read
        queue.add("ok", [f"{name}:high"], priority=5)  # the producer makes the high band's stream
        queue.add("ok", [f"{name}:low-later"], priority=-5, delay=300)  # the worker's promoter makes the low band's
        asyncio.run(_add_async(queue, "ok", [f"{name}:async"]))
    # a consumer that left without a heartbeat: the worker removes it (XGROUP DELCONSUMER)
    ghost_stream = QueueKeys.for_queue(names[0]).stream
    admin.xgroup_create(ghost_stream, GROUP, id="0")
    admin.xgroup_createconsumer(ghost_stream, GROUP, "ghost")

    # worker: reads every master, settles, retries, dead-letters, renews leases, reclaims, forgets the dead,
    # checks execution idempotency, and fires a schedule while it leads the scheduler
    runs: Counter[str] = Counter()
    every_second = Schedule("acl-tick", "ok", names[1], every_ms=1000, args=["tick"])
    worker = WorkerThread(names, registry_recording(runs), urls["worker"], visibility_timeout_ms=1500,
                          dead_worker_grace_ms=500, promoter_poll_interval=0.05, schedules=[every_second],
                          limits={"slow": {"concurrency": 1}, names[0]: {"rate": "1000/s"}})
    try:
        expected = {f"{n}:{tag}" for n in names
                    for tag in ("one", "keyed", "later", "slow", "broken", "async", "idempotent", "high", "low-later")
                    } | {"tick"}
        wait_for(lambda: expected <= set(runs), 60, "every job to run as the worker user")
        wait_for(lambda: "ghost" not in {c["name"].decode() for c in admin.xinfo_consumers(
            QueueKeys.for_queue(names[0]).stream, GROUP)}, 30, "the worker to forget the silent consumer")

        # console: reads, pause and resume, the DLQ, the delayed set, metrics, the cache and the channel layer
        console = connect(urls["console"])
        assert stats.list_queues(console) == names
        assert {s.name for s in stats.all_queue_stats(console)} == set(names)
        assert [w.id for w in stats.workers(console)] == [worker.worker.id]
        metrics.multi_series(console, names, resolution="second", window=60)
        totals.read_totals(console, names)
        for name in names:
            assert stats.pause(console, name)
            wait_for(lambda name=name: worker.worker.paused[name], 10, "the worker to see the pause")
            time.sleep(0.3)  # a read under way when it did (BLOCK 200 ms) has returned
            Queue(name, redis_client=producer).add("ok", [f"{name}:while-paused"], priority=1)
            # the list of a queue's jobs, with who holds each (XPENDING), its high band first; the schedule's
            # ticks also wait in names[1] while it is paused
            first = waiting.page(console, name).items[0]
            assert (first.job.args, first.priority) == ([f"{name}:while-paused"], 1)
            assert stats.resume(console, name)
            dead = DeadLetters(console, name)
            [entry] = dead.page().items
            dead.groups()
            assert dead.replay([entry.entry_id]) == 1
            queue = Queue(name, redis_client=console)  # the console's enqueue form
            queue.add("ok", [f"{name}:cancel-me"], job_id=f"{name}-cancel", delay=600_000)
            queue.add("ok", [f"{name}:run-now"], job_id=f"{name}-now", delay=600_000)
            assert delayed.page(console, name).items
            assert delayed.cancel(console, name, f"{name}-cancel")
            assert delayed.run_now(console, name, f"{name}-now")
            # the DLQ's search, counts and index; a job cancelled by id; history and limits
            TextSearch(console, name).search("no such text")
            estimate_matching(dead, DLQFilter(task="broken"))
            dead.count_matching(DLQFilter(task="broken", reason="retries_exhausted"))
            queue.add("ok", [f"{name}:cancelled"], job_id=f"{name}-cancelled", delay=600_000)
            queue.cancel(f"{name}-cancelled")
            history.window(console, name, "24h")
            running_jobs.running_jobs(console, worker.worker.id, names)
            limits.read_buckets(console, QueueKeys.for_queue(name))
        wait_for(lambda: all(runs[f"{n}:run-now"] == 1 for n in names), 30, "the jobs run now")
        stats.prune_stale_workers(console)
        # the schedules page: states and recent fires, pause and resume, a fire by hand recorded
        [state] = scheduler.read_states(console, ["acl-tick"])
        assert state.fired >= 1 and state.recent
        assert scheduler.set_paused(console, "acl-tick", "olga") and scheduler.set_paused(console, "acl-tick", None)
        scheduler.record_fire(console, Scripts(console), "acl-tick",
                              scheduler.FireRecord(1, 1, "schedule:acl-tick:manual:1", names[1], "manual", "olga"))
        from chasqui_core import prometheus
        from chasqui_core.health import HealthCheck
        from dashboard.readings import Reader

        assert b"chasqui_queue_stream_length" in prometheus.render(console)
        Reader(console).read(names)
        assert HealthCheck(urls["console"], lock_ttl_ms=5000).run().redis == "ok"
        _cache_and_channel_layer(urls["console"])
        # an operator quiets the worker: the console writes the command, the worker reads it
        assert control.send(Scripts(console), worker.worker.id, "quiet")
        wait_for(lambda: [w.state for w in stats.workers(console)] == ["quiet"], 30, "the worker to be quiet")
    finally:
        worker.stop()
    refused = {(entry["reason"], entry["object"]) for entry in acl_refusals(cluster)}
    assert refused == set(), f"the documented rules refused {sorted(refused)}"


def _cache_and_channel_layer(url: str) -> None:
    from chasqui_core.cache import RedisCache
    from chasqui_core.channel_layer import redis_channel_layer

    cache = RedisCache(url, {"KEY_PREFIX": "chasqui-web"})  # what the API's count of wrong keys does
    cache.set("api-key-failures:10.0.0.1", (1, time.time()), 60)
    assert cache.get("api-key-failures:10.0.0.1")[0] == 1

    async def round_trip() -> dict:
        layer = redis_channel_layer([url])
        channel = await layer.new_channel()
        await layer.group_add("console-queue-x", channel)
        await asyncio.sleep(0.2)  # the subscription is live
        await layer.group_send("console-queue-x", {"type": "live.fragment", "html": "<p>1</p>"})
        message = await asyncio.wait_for(layer.receive(channel), 10)
        await layer.group_discard("console-queue-x", channel)
        return message

    assert asyncio.run(round_trip())["html"] == "<p>1</p>"


def test_the_cache_spreads_multi_key_calls_over_the_masters(acl_cluster):
    from chasqui_core.cache import RedisCache

    cluster, _ = acl_cluster
    cache = RedisCache(cluster.url, {"KEY_PREFIX": "chasqui-web"})
    values = {f"key-{i}": i for i in range(30)}  # their slots fall on every master
    cache.set_many(values, 60)
    assert cache.get_many(list(values)) == values
    assert cache.incr("key-3", 2) == 5
    cache.delete_many(list(values)[:10])
    assert len(cache.get_many(list(values))) == 20
    assert cache.clear()
    assert cache.get_many(list(values)) == {}


def test_a_wrong_password_is_one_clear_error_naming_the_setting(acl_cluster, settings):
    cluster, urls = acl_cluster
    url = re.sub(r":(\w+)@", ":not-the-password@", urls["worker"])
    forget(url)
    with pytest.raises(RedisConfigError, match="refused the URL's credentials") as caught:
        connect(url)
    assert "not-the-password" not in str(caught.value) and masked(url) in str(caught.value)
    settings.CHASQUI = {"REDIS_URL": url}
    with pytest.raises(CommandError, match=r"settings.CHASQUI\['REDIS_URL'\]: .*chasqui-worker:\*\*\*@.*credentials"):
        call_command("runworker", "default")


def test_a_user_without_cluster_info_is_still_recognised_as_on_a_cluster_through_info(acl_cluster):
    cluster, _ = acl_cluster
    for port in cluster.ports:
        node = cluster.client(port)
        node.execute_command("ACL", "SETUSER", "chasqui-info-only", "on", ">info-pw", "~*", "+@all", "-cluster|info")
        node.close()
    url = f"redis://chasqui-info-only:info-pw@127.0.0.1:{cluster.ports[0]}/0"
    forget(url)
    assert is_cluster_client(connect(url))


def test_a_user_missing_a_permission_gets_noperm_naming_the_command(acl_cluster):
    cluster, urls = acl_cluster
    producer = connect(urls["producer"])
    with pytest.raises(redis.exceptions.NoPermissionError, match="xreadgroup"):
        producer.xreadgroup(GROUP, "me", {QueueKeys.for_queue("acl-0").stream: ">"}, count=1)
