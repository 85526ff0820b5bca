"""InFlight, the one owner of a worker's deliveries, and the invariant it keeps with the settler and the stream:
whatever a worker reads is held, settled, or given back, and never two of these at once."""

from __future__ import annotations

import threading

from chasqui_core.engine.worker.delivery import Delivery, DeliveryRef, ref_of
from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.worker_app import wait_for
from tests.helpers import worker_running


def delivery(keys: QueueKeys, entry_id: bytes, started: int = 0) -> Delivery:
    job = Job(task="t.noop", args=[], kwargs={}, id=f"job-{entry_id.decode()}-{keys.band}")
    handler = HandlerRegistry()
    d = Delivery(keys, entry_id, b"", job, handler.register("t.noop", lambda: None), ref_of(keys.stream, entry_id))
    d.started = started
    return d


def test_a_reference_is_its_stream_and_entry_id_and_equal_references_are_one_key():
    ref = ref_of("{chasqui:q}:stream", b"1-0")
    assert ref == DeliveryRef("{chasqui:q}:stream", b"1-0") and type(ref) is DeliveryRef
    assert (ref.stream, ref.entry_id) == ("{chasqui:q}:stream", b"1-0")
    assert ref != ref_of("{chasqui:q}:stream:high", b"1-0")
    assert len({ref, DeliveryRef("{chasqui:q}:stream", b"1-0")}) == 1


def test_the_same_entry_id_in_two_bands_is_two_deliveries():
    keys = QueueKeys.for_queue("q")
    high = keys.in_band("high")
    held = InFlight()
    a, b = delivery(keys, b"5-0"), delivery(high, b"5-0")
    held.add(a)
    held.add(b)
    assert len(held) == 2 and a.ref in held and b.ref in held
    assert held.by_stream(keys) == [b"5-0"] and held.by_stream(high) == [b"5-0"]
    assert held.remove(a) is True
    assert held.holds(b) and not held.holds(a) and len(held) == 1


def test_a_delivery_leaves_once_and_a_later_read_of_its_entry_is_not_it():
    keys = QueueKeys.for_queue("q")
    held = InFlight()
    first = delivery(keys, b"1-0")
    held.add(first)
    assert held.remove(first) is True
    assert held.remove(first) is False, "a second outcome of one delivery must find it gone"
    again = delivery(keys, b"1-0")  # the entry read again (taken back and delivered anew)
    held.add(again)
    assert not held.holds(first) and held.holds(again)
    assert held.remove(first) is True, "the reference names the entry: removing by an old read frees the new one"


def test_the_running_list_is_the_started_ones_longest_running_first_and_iterating_is_a_snapshot():
    keys = QueueKeys.for_queue("q")
    held = InFlight()
    waiting, late, early = delivery(keys, b"1-0"), delivery(keys, b"2-0", started=200), delivery(keys, b"3-0", 100)
    for d in (waiting, late, early):
        held.add(d)
    assert held.running() == [early, late]
    for d in held:  # removing while walking is safe
        held.remove(d)
    assert len(held) == 0 and held.running() == []


def test_every_entry_read_is_held_settled_or_given_back_exactly_once(redis, redis_url):
    """Jobs that succeed, fail for good, run when the worker stops, and wait unstarted when it stops (given
    back): once a second worker has drained the rest, every job ran exactly once and nothing is held or pending."""
    queue, registry = "inflight-inv", HandlerRegistry()
    gate = threading.Event()
    runs: list[str] = []
    registry.register("t.ok", lambda: runs.append("ok"))
    registry.register("t.fail", lambda: 1 / 0, max_attempts=1)

    def slow() -> None:
        gate.wait(10)
        runs.append("slow")

    registry.register("t.slow", slow)
    q = Queue(queue, url=redis_url)
    for task, n in (("t.ok", 20), ("t.fail", 5), ("t.slow", 6)):
        for _ in range(n):
            q.add(task)
    keys = QueueKeys.for_queue(queue)
    with worker_running(redis_url, [queue], registry, concurrency=2) as first:
        wait_for(lambda: int(redis.xlen(keys.dlq)) == 5 and runs.count("ok") == 20 and len(first.held.running()) == 2,
                 20,
                 "the failures dead-lettered, the quick ones run, two slow jobs running")
        assert len(first.held) == 6, "the two slow runs and the four fetched behind them are held"
        threading.Timer(0.5, gate.set).start()  # the two running finish during the stop
    assert len(first.held) == 0, "a stopped worker holds nothing: each delivery was settled or given back"
    assert runs.count("slow") == 2
    with worker_running(redis_url, [queue], registry, concurrency=2) as second:
        wait_for(lambda: runs.count("slow") == 6, 20, "the four given back to run on the second worker")
        wait_for(lambda: len(second.held) == 0, 10, "the second worker to settle them")
    assert sorted(runs) == ["ok"] * 20 + ["slow"] * 6, "every job ran exactly once"
    assert redis.xpending(keys.stream, GROUP)["pending"] == 0
    assert int(redis.xlen(keys.dlq)) == 5


def test_a_held_delivery_is_found_by_its_reference_and_listed_only_under_its_own_stream():
    keys = QueueKeys.for_queue("q")
    high = keys.in_band("high")
    held = InFlight()
    low_one, low_two, high_one = delivery(keys, b"1-0"), delivery(keys, b"2-0"), delivery(high, b"3-0")
    for d in (low_one, low_two, high_one):
        held.add(d)
    assert held.get(low_two.ref) is low_two and held.get(high_one.ref) is high_one
    assert held.get(ref_of(keys.stream, b"3-0")) is None, "an entry id of another stream is not this one's"
    assert held.by_stream(keys) == [b"1-0", b"2-0"] and held.by_stream(high) == [b"3-0"]
