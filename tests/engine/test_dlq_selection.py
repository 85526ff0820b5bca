"""Bulk replays and discards by filter at scale: through the DLQ's index, against a real server.

What is read is measured on the server itself (its ``total_net_output_bytes``): a sweep that reads the
whole DLQ to act on a few entries sends every entry out, one through the index sends the few.
"""

import random

import pytest

from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.index import DLQIndex
from chasqui_core.engine.dlq.operations import Operations, run_pending
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.dlq.selection import chunks, matching_total
from chasqui_core.engine.jobs.envelope import decode
from tests.engine.dlq_entries import KEYS, Q, add_dead, bulk_dead, dead_job, fields_for
from tests.helpers import info_per_server

RARE = "shop.rare_refund"


def sent_bytes(redis) -> int:
    """Bytes the server (every master of a cluster) has sent since it started."""
    return sum(int(info["total_net_output_bytes"]) for info in info_per_server(redis, "stats"))


def stream_job_ids(redis) -> list[str]:
    return [decode(f[b"j"]).id for _, f in redis.xrange(KEYS.stream)]


@pytest.fixture
def big(redis):
    """6,000 dead jobs of common tasks around 12 of a rare one, with the index ready; the rare job ids."""
    bulk_dead(redis, 3000)
    rare = [dead_job(RARE, messages=("refund failed",)) for _ in range(12)]
    for job in rare:
        add_dead(redis, job)
    bulk_dead(redis, 3000, task="reports.build")
    assert DLQIndex(redis, Q).rebuild().ready
    return [job.id for job in rare]


def whole_dlq_bytes(redis) -> int:
    before = sent_bytes(redis)
    redis.xrange(KEYS.dlq)
    return sent_bytes(redis) - before


def test_a_filtered_operation_reads_only_the_matching_entries(redis, big):
    whole = whole_dlq_bytes(redis)
    ops = Operations(redis, Q)
    ops.submit("few", "replay", DLQFilter(task=RARE), total=12)
    before = sent_bytes(redis)
    [record] = run_pending(redis, Q, "w")
    read = sent_bytes(redis) - before
    assert (record.state, record.done, record.count, record.total) == ("done", 12, 12, 12)
    assert sorted(stream_job_ids(redis)) == sorted(big)
    assert read < whole / 20, f"the operation read {read:,} bytes; the whole DLQ is {whole:,}"


def test_a_small_filtered_replay_inline_reads_only_the_matching_entries(redis, big):
    dl = DeadLetters(redis, Q)
    whole = whole_dlq_bytes(redis)
    before = sent_bytes(redis)
    progress = []
    assert dl.replay_matching(DLQFilter(task=RARE), progress=lambda *p: progress.append(p)) == 12
    read = sent_bytes(redis) - before
    assert progress == [(0, 12), (12, 12)]
    assert sorted(stream_job_ids(redis)) == sorted(big)
    assert read < whole / 20, f"the replay read {read:,} bytes; the whole DLQ is {whole:,}"


def test_a_discard_on_indexed_values_reads_no_entry(redis, big):
    dl = DeadLetters(redis, Q)
    whole = whole_dlq_bytes(redis)
    before = sent_bytes(redis)
    assert dl.discard_matching(DLQFilter(task="reports.build")) == 3000
    read = sent_bytes(redis) - before
    assert dl.count() == 3012 and dl.count_matching(DLQFilter(task="reports.build")) == 0
    assert read < whole / 20, f"the discard read {read:,} bytes; the whole DLQ is {whole:,}"


def test_a_stopped_operation_says_how_many_of_how_many_and_a_second_run_moves_at_once(redis):
    bulk_dead(redis, 5000, task="reports.build")  # older than every match: a sweep of the DLQ meets them first
    _, wanted = bulk_dead(redis, 3000)
    assert DLQIndex(redis, Q).rebuild().ready
    ops = Operations(redis, Q)
    f = DLQFilter(task="emails.send")
    steps = []

    def after_one_chunk():
        steps.append(1)
        return len(steps) > 1

    ops.submit("first", "replay", f, total=2900)  # the caller's estimate; the sweep counts exactly
    assert ops.claim_next("a") == "first"
    assert ops.run("first", "a", should_stop=after_one_chunk, chunk=1000).done == 1000
    stopped = ops.cancel("first")
    assert (stopped.state, stopped.done, stopped.count, stopped.total, stopped.total_exact) == (
        "cancelled",
        1000,
        1000,
        3000,
        True,
    )

    steps.clear()
    ops.submit("second", "replay", f, total=2000)
    assert ops.claim_next("b") == "second"
    again = ops.run("second", "b", should_stop=after_one_chunk, chunk=1000)
    assert (again.state, again.done, again.count, again.total) == ("pending", 1000, 1000, 2000)
    [again] = run_pending(redis, Q, "c")
    assert (again.state, again.done, again.count) == ("done", 2000, 2000)
    assert sorted(stream_job_ids(redis)) == sorted(wanted)


def test_the_index_walk_keeps_stream_order_when_a_millisecond_holds_thousands(redis):
    """Past 2,047 entries in one millisecond the index's scores tie, and Redis orders ties by bytes
    ("5-10000" before "5-9999"): the walk still takes each entry once, in the stream's order."""
    ids = []
    pipe = redis.pipeline(transaction=False)
    for seq in range(6000):
        job = dead_job("emails.send" if seq % 3 else "reports.build", messages=(f"row {seq}",))
        pipe.xadd(KEYS.dlq, fields_for(job), id=f"1700000000000-{seq}")
        if seq % 3:
            ids.append(f"1700000000000-{seq}")
    pipe.execute()
    assert DLQIndex(redis, Q).rebuild().ready
    dl = DeadLetters(redis, Q)
    walked = [
        eid
        for step in chunks(dl, DLQFilter(task="emails.send"), (0, 0), (2**64 - 1, 2**64 - 1), 700, decode=False)
        for eid in step.ids
    ]
    assert walked == ids
    assert dl.discard_matching(DLQFilter(task="emails.send"), chunk=700) == 4000
    assert dl.count() == 2000


def test_through_the_index_a_sweep_acts_on_exactly_what_the_filter_matches(redis):
    rng = random.Random(5)
    for i in range(1500):
        cls = rng.choice(["ValueError", "KeyError", "app.errors.ValueError"])
        job = dead_job(rng.choice(["a.t", "b.t", "c.t"]), cls=cls, messages=(f"row {i} {rng.choice(['x', 'needle'])}",))
        add_dead(redis, job, rng.choice(["retries_exhausted", "unrecoverable"]))
    assert DLQIndex(redis, Q).rebuild().ready
    dl = DeadLetters(redis, Q)
    everything = dl.page(limit=2000).items
    middle = sorted(d.dead_at_ms for d in everything)[len(everything) // 3]
    f = DLQFilter(task="b.t", error_class="ValueError", error_text="NEEDLE", since_ms=middle)
    expected = {d.entry_id for d in everything if f.matches(d)}
    assert expected  # the draw holds some
    acted = [eid for step in chunks(dl, f, (0, 0), (2**64 - 1, 2**64 - 1), 50, decode=True) for eid in step.ids]
    assert sorted(acted) == sorted(expected) and len(acted) == len(set(acted))
    assert dl.replay_matching(f, chunk=50) == len(expected)
    assert {d.entry_id for d in dl.page(limit=2000).items} == {d.entry_id for d in everything} - expected


def test_the_total_a_resumed_sweep_starts_from_is_exact_inside_a_millisecond(redis):
    """Counts go by millisecond; a cursor inside one leaves out the entries of that millisecond before it."""
    pipe = redis.pipeline(transaction=False)
    for ms in (1000, 1001, 1002):
        for seq in range(10):
            pipe.xadd(KEYS.dlq, fields_for(dead_job("emails.send" if seq % 2 else "reports.build")), id=f"{ms}-{seq}")
    pipe.execute()
    assert DLQIndex(redis, Q).rebuild().ready
    dl = DeadLetters(redis, Q)
    f = DLQFilter(task="emails.send")
    for lo, hi in (((1000, 5), (1002, 3)), ((1000, 0), (1001, 9)), ((1001, 4), (1001, 6)), ((1002, 9), (1000, 0))):
        expected = sum(
            1 for d in dl.page(limit=100).items if lo <= tuple(map(int, d.entry_id.split("-"))) <= hi and f.matches(d)
        )
        assert matching_total(dl, f, lo, hi) == expected, (lo, hi)
        assert matching_total(dl, None, lo, hi) == sum(
            1 for d in dl.page(limit=100).items if lo <= tuple(map(int, d.entry_id.split("-"))) <= hi
        ), (lo, hi)
