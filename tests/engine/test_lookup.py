"""Finding a job by id in each state it can be in, against the real server (engine/ops/lookup.py)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from chasqui_core.engine.timing import delayed
from chasqui_core.engine.ops import lookup
from chasqui_core.engine.ops.stream_scan import CHUNK
from chasqui_core.engine.jobs.envelope import Job, new_job_id, now_ms
from chasqui_core.engine.dlq.index import DLQIndex
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.store.keys import DELAYED_MARK_GRACE_MS, GROUP, QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.jobs.results import encode_result
from chasqui_core.engine.store.scripts import Scripts
from tests.api.helpers import wait_for
from tests.helpers import TASK, WorkerThread, add_dead, dead_job

Q = "lookups"
KEYS = QueueKeys.for_queue(Q)


def find(redis, job_id: str, **kw) -> lookup.JobLookup:
    return lookup.find_job(redis, job_id, [Q, "elsewhere"], **kw)


def test_the_time_in_a_ulid_is_read_and_other_ids_have_none():
    before = now_ms()
    job_id = new_job_id()
    assert before <= lookup.ulid_ms(job_id) <= now_ms()
    assert lookup.ulid_ms("order-42") is None
    assert lookup.ulid_ms("schedule:nightly:1700000000000") is None
    assert lookup.ulid_ms("U" * 26) is None  # not Crockford base 32
    assert lookup.ulid_ms("Z" * 26) is None  # beyond 48 bits of milliseconds


def test_a_waiting_job_is_found_in_the_stream_near_its_time(redis):
    queue = Queue(Q, redis_client=redis)
    for i in range(50):
        queue.add(TASK, [i, 0])
    added = queue.add(TASK, [1, 2], {"password": "hunter2"})
    found = find(redis, added.job_id)
    assert found.state == "waiting" and found.queue == Q
    assert found.job is not None and found.job.args == [1, 2] and found.job.kwargs == {"password": "hunter2"}
    assert found.stream_entry == added.entry_id
    assert found.delivered_to is None and found.running is None
    assert found.scanned <= 2 * CHUNK
    assert any("around the id's time: found" in note for note in found.searched)


def test_a_waiting_job_far_from_its_time_is_found_by_the_wide_scan(redis):
    """A job promoted, retried or replayed gets an entry long after its id's time."""
    job = Job(new_job_id(), TASK, [1, 2], created_at=now_ms())
    redis.sadd(QUEUES_REGISTRY, Q)
    later = lookup.ulid_ms(job.id) + 3_600_000
    for i in range(lookup.NEAR + 10):  # entries the first look reads before giving up
        redis.xadd(KEYS.stream, {"j": Job(new_job_id(), TASK, [i]).encode()}, id=f"{later - 100_000 + i}-0")
    redis.xadd(KEYS.stream, {"j": job.encode()}, id=f"{later}-0")
    found = find(redis, job.id)
    assert (found.state, found.stream_entry) == ("waiting", f"{later}-0")
    assert any("the whole stream of lookups: found" in note for note in found.searched)


def test_a_delivered_job_is_running_and_names_its_consumer(redis):
    queue = Queue(Q, redis_client=redis)
    added = queue.add(TASK, [1, 2])
    redis.xgroup_create(KEYS.stream, GROUP, id="0", mkstream=True)
    redis.xreadgroup(GROUP, "host-1:77:abcd", {KEYS.stream: ">"}, count=10)
    found = find(redis, added.job_id)
    assert (found.state, found.delivered_to, found.deliveries) == ("running", "host-1:77:abcd", 1)
    assert found.running is None  # no heartbeat lists it yet


def test_a_job_a_real_worker_runs_is_running_with_its_worker_and_start(redis, redis_url):
    release = threading.Event()
    started = threading.Event()

    def slow(*args):
        started.set()
        release.wait(20)

    registry = HandlerRegistry()
    registry.register("slow", slow, is_async=False)
    added = Queue(Q, redis_client=redis).add("slow", [1])
    worker = WorkerThread([Q], registry, redis_url, concurrency=2)
    try:
        assert started.wait(20)
        found = wait_for(lambda: (f := find(redis, added.job_id)).running is not None and f, 10)
        assert found.state == "running" and found.queue == Q
        assert found.running.worker == found.delivered_to
        assert abs(found.running.started_at_ms - now_ms()) < 15_000
        assert found.job is not None and found.job.task == "slow"
    finally:
        release.set()
        worker.stop()


def _at_mark(found: lookup.JobLookup) -> bool:
    return any("delayed set of lookups at the job's mark: found" in note for note in found.searched)


def _scanned_delayed(found: lookup.JobLookup) -> bool:
    return any(note.startswith("the delayed set of lookups:") for note in found.searched)


def test_a_delayed_job_is_found_at_its_mark_with_its_due_time_without_a_scan(redis):
    queue = Queue(Q, redis_client=redis)
    for i in range(30):
        queue.add(TASK, [i, 0], delay=60_000 + i)
    added = queue.add(TASK, [1, 2], delay=3_600_000)
    found = find(redis, added.job_id)
    assert found.state == "delayed" and found.queue == Q and found.job.args == [1, 2] and _at_mark(found)
    assert not _scanned_delayed(found)
    assert found.run_at_ms == delayed.find(redis, Q, added.job_id).run_at_ms
    assert found.run_at_ms == int(float(redis.get(KEYS.delayed_mark(added.job_id))))
    assert found.run_at_ms == int(redis.zscore(KEYS.delayed, delayed.find(redis, Q, added.job_id).member))
    # the mark lapses a day (the grace) after the job is due
    lapses = redis.pttl(KEYS.delayed_mark(added.job_id))
    assert 3_600_000 + DELAYED_MARK_GRACE_MS - 60_000 < lapses <= 3_600_000 + DELAYED_MARK_GRACE_MS


def test_a_retrying_job_is_found_at_its_mark(redis, redis_url):
    def fails(*args):
        raise RuntimeError("not yet")

    registry = HandlerRegistry()
    registry.register("fails", fails, is_async=False, max_attempts=3, backoff=3_600_000)
    added = Queue(Q, redis_client=redis).add("fails", [1])
    worker = WorkerThread([Q], registry, redis_url, concurrency=2)
    try:
        wait_for(lambda: redis.zcard(KEYS.delayed) == 1, 20)
    finally:
        worker.stop()
    assert redis.exists(KEYS.delayed_mark(added.job_id))
    found = find(redis, added.job_id)
    assert found.state == "delayed" and _at_mark(found) and not _scanned_delayed(found)
    assert found.job.attempt == 1 and found.job.errors[0]["message"] == "not yet"
    assert found.run_at_ms > now_ms() + 3_000_000


def test_a_job_that_left_the_delayed_set_is_not_scanned_for_there(redis):
    queue = Queue(Q, redis_client=redis)
    due = queue.add(TASK, [1], run_at=datetime.fromtimestamp((now_ms() - 1000) / 1000, tz=UTC))
    moved = queue.add(TASK, [2], delay=3_600_000)
    Scripts(redis).promote(keys=[KEYS.delayed, KEYS.stream, KEYS.events, KEYS.promoter_lock],
                           args=["", 100, KEYS.metrics, 1000])
    assert delayed.run_now(redis, Q, moved.job_id) is not None
    for job_id, args in ((due.job_id, [1]), (moved.job_id, [2])):
        assert redis.exists(KEYS.delayed_mark(job_id))  # stale: the job left the set
        found = find(redis, job_id)
        assert found.state == "waiting" and found.job.args == args
        assert any("at the job's mark: not there" in note for note in found.searched)
        assert not _scanned_delayed(found)
        assert delayed.find(redis, Q, job_id) is None


def test_jobs_sharing_one_due_time_are_found_at_their_mark(redis):
    """A bulk schedule: members of one score are bisected by their id's bytes."""
    queue = Queue(Q, redis_client=redis)
    at = datetime.fromtimestamp(now_ms() // 1000 + 3600, tz=UTC)
    queue.add(TASK, [-1], delay=1_800_000)
    added = queue.add_bulk([JobSpec(TASK, [i], run_at=at) for i in range(3_000)])
    queue.add(TASK, [-2], delay=7_200_000)
    by_id = sorted(added, key=lambda e: e.job_id)
    picks = [by_id[0], by_id[1], by_id[1234], by_id[-2], by_id[-1], added[0], added[-1]]
    for pick in picks:
        found = find(redis, pick.job_id)
        assert found.state == "delayed" and _at_mark(found), pick
        assert found.run_at_ms == int(at.timestamp() * 1000)
        assert found.job.args == [added.index(pick)]
        assert delayed.find(redis, Q, pick.job_id).job_id == pick.job_id
    delayed.cancel(redis, Q, by_id[1234].job_id)
    gone = find(redis, by_id[1234].job_id)
    assert gone.state is None and not _scanned_delayed(gone)


def test_a_job_delayed_before_marks_were_written_is_found_by_a_scan(redis):
    queue = Queue(Q, redis_client=redis)
    for i in range(30):
        queue.add(TASK, [i, 0], delay=60_000 + i)
    job = Job(new_job_id(), TASK, [1, 2], created_at=now_ms())
    redis.zadd(KEYS.delayed, {job.encode(): now_ms() + 60_000})  # a member without a mark
    found = find(redis, job.id)
    assert found.state == "delayed" and found.job.args == [1, 2]
    assert _scanned_delayed(found) and not _at_mark(found)
    assert delayed.find(redis, Q, job.id).job_id == job.id


def test_a_job_replayed_to_a_later_time_is_found_at_its_mark(redis):
    job = dead_job(args=(7, 8))
    entry = add_dead(redis, Q, job)
    run_at = now_ms() + 3_600_000
    assert DeadLetters(redis, Q).replay([entry], run_at_ms=run_at) == 1
    found = find(redis, job.id)
    assert found.state == "delayed" and _at_mark(found) and found.run_at_ms == run_at


def test_a_dead_job_is_found_in_the_dlq(redis):
    for i in range(20):
        add_dead(redis, Q, args=(i, 0))
    job = dead_job(args=(7, 8))
    entry = add_dead(redis, Q, job)
    found = find(redis, job.id)
    assert found.state == "dead" and found.queue == Q
    assert found.dead is not None and found.dead.entry_id == entry and found.job.args == [7, 8]


def test_a_dead_job_the_index_names_is_found_before_any_stream_is_read(redis):
    """Thousands of jobs made about when the dead one was wait in the stream: the index is asked first."""
    queue = Queue(Q, redis_client=redis)
    job = dead_job(args=(7, 8))
    queue.add_bulk([JobSpec(TASK, [i]) for i in range(3 * CHUNK)])
    entry = add_dead(redis, Q, job)
    assert DLQIndex(redis, Q).rebuild().ready
    found = find(redis, job.id)
    assert (found.state, found.dead.entry_id) == ("dead", entry)
    assert found.scanned == 0 and any("dead-letter index of lookups: found" in n for n in found.searched)


def test_a_replayed_job_is_found_at_the_entry_its_replay_gave_it(redis):
    """A replayed job's entry is far from its id's time and no longer in the DLQ's index: its replay mark
    leads to it, and a mark whose entry is gone (the job ran since) is checked, not believed."""
    queue = Queue(Q, redis_client=redis)
    job = dead_job(args=(7, 8))
    entry = add_dead(redis, Q, job)
    queue.add_bulk([JobSpec(TASK, [i]) for i in range(lookup.NEAR + 2 * CHUNK)])
    assert DeadLetters(redis, Q).replay([entry]) == 1
    found = find(redis, job.id)
    assert found.state == "waiting" and found.job.args == [7, 8] and found.job.replays == 1
    assert found.scanned <= 1 and any("the entry its replay gave it: found" in n for n in found.searched)
    redis.xdel(KEYS.stream, found.stream_entry)
    gone = find(redis, job.id)
    assert gone.state is None and any("gone (it ran since)" in n for n in gone.searched)


def test_a_dead_job_made_long_before_it_died_is_found(redis):
    job = dead_job()
    job = Job("01" + job.id[2:], job.task, job.args, attempt=job.attempt, errors=job.errors)  # made in the 2000s
    for i in range(3 * CHUNK):
        add_dead(redis, Q, args=(i, 0))
    entry = add_dead(redis, Q, job)
    found = find(redis, job.id)
    assert (found.state, found.dead.entry_id) == ("dead", entry)
    assert found.scanned <= 2 * CHUNK  # the newest end is read at once


def test_a_finished_job_is_found_by_its_result_record(redis):
    redis.sadd(QUEUES_REGISTRY, Q)
    job_id = new_job_id()
    redis.set(KEYS.result + job_id, encode_result(job_id=job_id, task=TASK, status="SUCCESSFUL", args=[1, 2],
                                                  kwargs={}, enqueued_at=now_ms(), return_value=3))
    found = find(redis, job_id)
    assert (found.state, found.queue, found.result["return_value"]) == ("finished", Q, 3)
    assert found.scanned == 0


def test_a_ready_result_record_does_not_hide_the_waiting_job(redis):
    queue = Queue(Q, redis_client=redis)
    added = queue.add(TASK, [1, 2], result_ttl=60)
    # the READY record the Django backend writes at enqueue
    redis.set(KEYS.result + added.job_id, encode_result(job_id=added.job_id, task=TASK, status="READY", args=[1, 2],
                                                        kwargs={}, enqueued_at=now_ms()), px=60_000)
    found = find(redis, added.job_id)
    assert found.state == "waiting" and found.result is not None and found.result["status"] == "READY"


def test_a_caller_given_id_is_found_by_a_bounded_scan(redis):
    queue = Queue(Q, redis_client=redis)
    for i in range(100):
        queue.add(TASK, [i, 0])
    queue.add(TASK, [1, 2], job_id="order-42")
    found = find(redis, "order-42")
    assert found.state == "waiting" and found.job.args == [1, 2]
    assert found.queue == Q  # its id marker names the queue: no other is searched
    assert not any("elsewhere" in note for note in found.searched[1:])


def test_a_job_found_nowhere_says_where_it_looked_and_whether_that_was_all(redis):
    queue = Queue(Q, redis_client=redis)
    for i in range(300):
        queue.add(TASK, [i, 0])
    missing = new_job_id()
    found = find(redis, missing)
    assert found.state is None and found.complete
    assert any("delayed set of lookups" in note for note in found.searched)
    assert any("dead-letter queue of lookups" in note for note in found.searched)
    cut = find(redis, "order-0", scan_limit=100)
    assert cut.state is None and not cut.complete
    assert any("stopped at the limit of 100" in note for note in cut.searched)


def test_bad_ids_are_refused_in_words(redis):
    with pytest.raises(ValueError, match="job_id"):
        lookup.find_job(redis, "", [Q])
    with pytest.raises(ValueError, match="job_id"):
        lookup.find_job(redis, "x" * 201, [Q])


def test_a_waiting_or_running_job_of_a_priority_band_is_found_in_its_bands_stream(redis, redis_url):
    q = Queue("lk-bands", url=redis_url)
    q.add("t", priority=0)
    high = q.add("t", priority=3)
    low = q.add("t", priority=-3, job_id="not-a-ulid")  # no creation time: found by the wide scan
    found = lookup.find_job(redis, high.job_id, ["lk-bands"])
    assert (found.state, found.stream_entry, found.job.meta["priority"]) == ("waiting", high.entry_id, 3)
    assert any("high priority" in place for place in found.searched)
    assert lookup.find_job(redis, low.job_id, ["lk-bands"]).state == "waiting"
    keys = QueueKeys.for_queue("lk-bands").in_band("high")
    redis.xreadgroup(GROUP, "w1", {keys.stream: ">"}, count=1)
    found = lookup.find_job(redis, high.job_id, ["lk-bands"])
    assert (found.state, found.delivered_to) == ("running", "w1")


def test_a_narrow_lookup_reads_only_where_the_id_leads_and_says_what_it_left(redis):
    """``wide=False``: an unknown id is answered without reading the stream or the delayed set whole, and the
    answer says what was left unread, so a wide lookup can be asked for; a job where its id leads is found."""
    queue = Queue(Q, redis_client=redis)
    for i in range(6000):
        queue.add(TASK, [i, 0])
    far = queue.add(TASK, [1, 2], job_id="order-77")  # a caller-given id: no time to start from
    delayed = queue.add(TASK, [3, 4], delay=3600)
    missing = new_job_id()

    narrow = find(redis, missing, wide=False)
    assert narrow.state is None and not narrow.complete and narrow.narrowed
    assert narrow.scanned <= 4_000  # the stream near the id's time, nothing more
    assert any("not read: " in note and "the rest of the stream of lookups" in note for note in narrow.searched)
    assert find(redis, missing).scanned > 6_000  # the wide lookup reads it all, and is sure
    assert find(redis, missing).complete

    assert find(redis, delayed.job_id, wide=False).state == "delayed"  # at its mark
    found = find(redis, "order-77", wide=False)  # no time in the id: the entry its marker names
    assert (found.state, found.job.id, found.stream_entry) == ("waiting", far.job_id, far.entry_id)
    assert found.scanned <= 5


def test_a_narrow_lookup_of_empty_queues_is_complete(redis):
    Queue(Q, redis_client=redis).add(TASK, [1, 0])
    redis.delete(QueueKeys.for_queue(Q).stream)
    found = find(redis, new_job_id(), wide=False)
    assert found.state is None and found.complete and not found.narrowed


def test_a_job_promoted_when_due_is_found_near_its_due_time_by_a_narrow_lookup(redis):
    """Its stream entry is far from its id's time but at its due time, which its (stale) mark still holds."""
    queue = Queue(Q, redis_client=redis)
    later = queue.add(TASK, [7], delay=timedelta(seconds=4))
    queue.add_bulk([JobSpec(TASK, [i, 0]) for i in range(6000)])  # between its making and its due time
    while redis.zcard(KEYS.delayed):
        time.sleep(0.1)
        Scripts(redis).promote(keys=[KEYS.delayed, KEYS.stream, KEYS.events, KEYS.promoter_lock],
                               args=["", 100, KEYS.metrics, 1000])
    found = find(redis, later.job_id, wide=False)
    assert found.state == "waiting" and found.job.args == [7], found.searched
    assert any("around its due time: found" in note for note in found.searched)
    assert found.scanned < 6000
