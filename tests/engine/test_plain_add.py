"""The plain add (``enqueue_plain.lua``): a single job ready now, of the default band, without a caller-given id.

It does only what such a job needs, outside the prelude, so these tests hold
it to what ``enqueue.lua`` (through the prelude's ``bump_counters``) writes for
the same job, and to the lane's promise: a re-sent write adds nothing.
"""

from __future__ import annotations

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.ops.metrics import MINUTE_BUCKET_TTL_S, SECOND_BUCKET_TTL_S
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.producer.wire import LANE_TTL_MS
from chasqui_core.engine.store.connection import is_cluster_client
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import source
from tests.helpers import keys_matching


def _counters(client, name: str) -> dict[str, tuple[bytes | None, bool]]:
    """Each counter key of a queue, by its kind (second, minute, total): its ``enqueued`` and whether its
    lifetime is that of its kind."""
    keys = QueueKeys.for_queue(name)
    out = {}
    for kind, prefix, ttl in (("second", keys.second_counters, SECOND_BUCKET_TTL_S),
                              ("minute", keys.minute_counters, MINUTE_BUCKET_TTL_S)):
        for key in keys_matching(client, f"{prefix}*"):
            left = client.ttl(key)
            out[kind] = (client.hget(key, "enqueued"), ttl - 60 < left <= ttl)
    out["total"] = (client.hget(keys.totals, "enqueued"), client.ttl(keys.totals) == -1)
    return out


def test_a_plain_add_counts_its_job_where_an_add_of_several_does(redis):
    plain = Queue("plain-counts", redis_client=redis)
    chunk = Queue("chunk-counts", redis_client=redis)
    added = plain.add("tasks.one", [1])
    chunk.add_bulk([JobSpec("tasks.one", [1]), JobSpec("tasks.two", [2])])  # two jobs: enqueue.lua
    assert added.entry_id is not None and not added.delayed and not added.duplicate
    assert _counters(redis, "plain-counts") == {"second": (b"1", True), "minute": (b"1", True), "total": (b"1", True)}
    assert _counters(redis, "chunk-counts") == {"second": (b"2", True), "minute": (b"2", True), "total": (b"2", True)}
    [(entry_id, fields)] = redis.xrange(QueueKeys.for_queue("plain-counts").stream)
    assert entry_id.decode() == added.entry_id and decode(fields[b"j"]).id == added.job_id


def test_jobs_with_options_still_take_the_full_script(redis):
    queue = Queue("plain-options", redis_client=redis)
    keys = QueueKeys.for_queue("plain-options")
    assert queue.add("tasks.later", delay=60_000).delayed
    assert queue.add("tasks.named", job_id="named-1").entry_id is not None
    assert queue.add("tasks.named", job_id="named-1").duplicate
    assert queue.add("tasks.urgent", priority=5).entry_id is not None
    assert redis.zcard(keys.delayed) == 1 and redis.xlen(keys.stream) == 1 and redis.xlen(keys.stream + ":high") == 1
    assert redis.hget(keys.totals, "enqueued") == b"3"


def test_a_resent_plain_write_adds_nothing_and_returns_the_first_entry(redis):
    keys = QueueKeys.for_queue("plain-resent")
    payload = Queue("plain-resent", redis_client=redis).build(JobSpec("tasks.once", [1])).payload
    script = redis.register_script(source("enqueue_plain"))

    def send(seq: str, again: str) -> bytes:
        return script(keys=[keys.stream, keys.lane + "lane-a", keys.totals],
                      args=[keys.second_counters, keys.minute_counters, SECOND_BUCKET_TTL_S, MINUTE_BUCKET_TTL_S,
                            LANE_TTL_MS, seq, again, payload])

    first = send("7", "")
    assert send("7", "1") == first  # its reply was lost: sent again, it finds its number in the lane
    assert redis.xlen(keys.stream) == 1 and redis.hget(keys.totals, "enqueued") == b"1"
    assert send("8", "1") != first  # a write re-sent whose first try never ran: it runs now
    assert redis.xlen(keys.stream) == 2 and redis.hget(keys.totals, "enqueued") == b"2"
    assert 0 < redis.pttl(keys.lane + "lane-a") <= LANE_TTL_MS


def test_a_plain_add_after_the_server_forgot_its_scripts_loads_them_and_lands_once(redis):
    queue = Queue("plain-noscript", redis_client=redis)
    queue.add("tasks.first")
    if is_cluster_client(redis):
        for node in redis.get_primaries():
            node.redis_connection.script_flush()
    else:
        redis.script_flush()
    added = queue.add("tasks.after_flush")
    assert redis.xlen(QueueKeys.for_queue("plain-noscript").stream) == 2 and added.entry_id is not None
    queue.close()


def _add_in_child(queue: Queue, out) -> None:
    from chasqui_core.engine.producer.link import process_id
    import os

    added = queue.add("tasks.child")  # the parent's link holds the parent's socket: a link of its own
    out.put((process_id() == os.getpid(), [link.pid for link in queue._links] == [os.getpid()], added.entry_id))


def test_a_forked_child_adds_through_a_connection_of_its_own(redis):
    import multiprocessing

    queue = Queue("plain-fork", redis_client=redis)
    queue.add("tasks.parent")
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_add_in_child, args=(queue, out))
    child.start()
    knows_its_pid, own_link, entry_id = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and knows_its_pid and own_link and entry_id is not None
    queue.add("tasks.parent_again")  # the parent's link still reads its own replies
    assert redis.xlen(QueueKeys.for_queue("plain-fork").stream) == 3
