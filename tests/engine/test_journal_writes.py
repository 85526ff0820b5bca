"""The start journal's writes reach the server: marks, strikes, after a dropped connection, and from a process
that dies the moment its send returned.

The journal writes fire-and-forget (``CLIENT REPLY OFF``) with the socket's
own non-blocking ``send``; these tests read what the server holds, on a real
server, waiting a little for the bytes to be read since nothing is answered.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from chasqui_core.engine.recovery.journal import StartJournal
from chasqui_core.engine.store.connection import is_cluster_client, node_url
from chasqui_core.engine.store.keys import QueueKeys

WORKER = "w-journal"


def server_of(redis, redis_url: str, keys: QueueKeys) -> tuple[str, dict]:
    """The URL of the server holding the queue's keys (its node, on a cluster), and how to aim a command at it."""
    if not is_cluster_client(redis):
        return redis_url, {}
    node = redis.get_node_from_key(keys.stream)
    return node_url(redis_url, node.host, node.port), {"target_nodes": node}


def journal_for(url: str, keys: QueueKeys) -> StartJournal:
    journal = StartJournal(WORKER, url)
    journal.use(keys.stream, keys.running(WORKER), dispatching=keys.dispatching(WORKER))
    journal.connect()
    return journal


def marks_become(redis, key: str, expected: dict[bytes, bytes], seconds: float = 10.0) -> dict[bytes, bytes]:
    """The running hash once it holds ``expected`` (what it holds at the deadline, otherwise)."""
    deadline = time.monotonic() + seconds
    while True:
        held = redis.hgetall(key)
        if held == expected or time.monotonic() > deadline:
            return held
        time.sleep(0.01)


def test_a_thread_going_from_run_to_run_leaves_only_the_run_under_way_marked(redis, redis_url):
    keys = QueueKeys.for_queue("j-runs")
    journal = journal_for(server_of(redis, redis_url, keys)[0], keys)
    try:
        journal.started_one(keys.stream, b"1-0", 1_700_000_000_001)
        journal.ended_and_started(keys.stream, b"1-0", keys.stream, b"2-0", 1_700_000_000_002)
        journal.ended_and_started(keys.stream, b"2-0", keys.stream, b"3-15", 1_700_000_000_003)
        assert marks_become(redis, keys.running(WORKER), {b"3-15": b"1700000000003"}) == {
            b"3-15": b"1700000000003"}
        journal.finished_one(keys.stream, b"3-15")
        assert marks_become(redis, keys.running(WORKER), {}) == {}
    finally:
        journal.close()


def test_marks_go_on_after_the_server_dropped_the_journal_connection(redis, redis_url):
    """A send into a connection the server closed fails (at once, or on the next send): the connection is
    opened again and the marks that follow reach the server."""
    keys = QueueKeys.for_queue("j-dropped")
    url, aim = server_of(redis, redis_url, keys)
    journal = journal_for(url, keys)
    try:
        journal.started_one(keys.stream, b"1-0", 1_700_000_000_001)
        assert marks_become(redis, keys.running(WORKER), {b"1-0": b"1700000000001"})
        host, port = journal._socks[None].getsockname()[:2]  # the journal's own connection, and no other
        redis.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}", **aim)
        deadline = time.monotonic() + 10
        entry = 2
        while redis.hget(keys.running(WORKER), b"%d-0" % entry) is None:  # the first sends may meet the RST
            assert time.monotonic() < deadline, "no mark reached the server after the connection was dropped"
            entry += 1
            journal.started_one(keys.stream, b"%d-0" % entry, 1_700_000_000_000 + entry)
            time.sleep(0.02)
        journal.finished_one(keys.stream, b"1-0")
        journal.finished_one(keys.stream, b"%d-0" % entry)
        held = marks_become(redis, keys.running(WORKER), {})
        assert b"1-0" not in held and b"%d-0" % entry not in held
    finally:
        journal.close()


@pytest.mark.timeout(60)
def test_a_mark_reaches_the_server_though_the_process_is_killed_right_after_the_send(redis, redis_url):
    keys = QueueKeys.for_queue("j-killed")
    url = server_of(redis, redis_url, keys)[0]
    program = textwrap.dedent(f"""
        import os, signal
        from chasqui_core.engine.recovery.journal import StartJournal
        from chasqui_core.engine.store.keys import QueueKeys
        keys = QueueKeys.for_queue("j-killed")
        journal = StartJournal({WORKER!r}, {url!r})
        journal.use(keys.stream, keys.running({WORKER!r}), dispatching=keys.dispatching({WORKER!r}))
        journal.connect()
        journal.started_one(keys.stream, b"7-0", 1700000000007)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.run([sys.executable, "-c", program], cwd=root, timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert marks_become(redis, keys.running(WORKER), {b"7-0": b"1700000000007"}) == {b"7-0": b"1700000000007"}
