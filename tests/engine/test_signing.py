"""Signed jobs: a worker given signing keys runs only jobs signed with one of them.

First the signature itself (HMAC-SHA256 over the fields a producer sets once,
whatever the key), then real worker processes (tests/engine/worker_app.py)
facing someone who can write to Redis but does not hold the key.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import time

import pytest

from chasqui_core.engine.jobs import events
from chasqui_core.engine.ops import totals
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.jobs.envelope import Job, decode, new_job_id, now_ms
from chasqui_core.engine.jobs.idempotency import IDEMPOTENCY_KEY
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.jobs.signing import SIGNATURE, Signer, signed_message
from tests.engine.worker_app import dlq_entries, read_runs, settled, wait_for

CURRENT = "current-" + "c" * 40
OLDER = "older-" + "o" * 40
STRANGER = "a-key-no-worker-lists-" + "s" * 40


def _job(queue: Queue, *args, **options) -> Job:
    """A job as the queue would send it, decoded as a worker sees it."""
    return decode(queue.build(JobSpec("echo", list(args), **options)).payload)


# --- the signature ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [b"k", b"k" * 32, b"k" * 64, b"k" * 65, os.urandom(200), "clé de prueba"],
                         ids=["1 byte", "32 bytes", "one block", "over a block", "200 random bytes", "text"])
def test_the_signature_is_hmac_sha256_of_the_signed_fields(key):
    raw = key.encode() if isinstance(key, str) else key
    fields = ("01J0000000000000000000000A", "billing.charge", [42, "EUR", {"x": [1.5, None, True]}],
              {"customer": "ana", "n": 2**40}, 1_700_000_000_123, "order-42")
    expected = hmac.new(raw, signed_message(*fields), "sha256").hexdigest()
    assert Signer([key]).sign(*fields) == expected


def test_keys_are_checked_with_errors_that_name_the_setting():
    with pytest.raises(ValueError, match=r"signing_keys must be a list of keys .* got str"):
        Signer("just-one-key-as-a-string")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"signing_keys\[1\] is empty"):
        Signer([CURRENT, ""])
    with pytest.raises(ValueError, match=r"signing_keys\[0\] must be a string or bytes, got int"):
        Signer([1234])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"signing_keys is empty"):
        Signer([])
    with pytest.raises(ValueError, match=r"signing_key must be a non-empty string or bytes"):
        Queue("q", url="redis://127.0.0.1:1/0", signing_key="")


def test_the_signed_fields_are_covered_and_the_changing_ones_are_not(redis):
    queue = Queue("sig", redis_client=redis, signing_key=CURRENT)
    signer = Signer([CURRENT, OLDER])
    job = _job(queue, 10, idempotency_key="order-9", attempts=3, result_ttl=60)
    assert signer.verify(job)
    # what a retry, a replay or a crash changes keeps the signature valid
    retried = dataclasses.replace(job, attempt=2, errors=[{"class": "E"}], replays=1, deaths=1, max_attempts=5,
                                  backoff={"strategy": "fixed"}, result_ttl=5, meta={**job.meta, "backend": "x"})
    assert signer.verify(decode(retried.encode()))
    # what the producer set once does not
    for change in ({"id": new_job_id()}, {"task": "other.task"}, {"args": [10000]}, {"kwargs": {"to": "eve"}},
                   {"created_at": job.created_at + 1}, {"meta": {**job.meta, IDEMPOTENCY_KEY: "order-10"}},
                   {"meta": {k: v for k, v in job.meta.items() if k != IDEMPOTENCY_KEY}}):
        assert not signer.verify(dataclasses.replace(job, **change)), change
    assert not Signer([STRANGER]).verify(job)
    assert Signer([STRANGER, CURRENT]).verify(job), "any listed key is accepted"


def test_missing_and_malformed_signatures_are_refused_in_words(redis):
    signer = Signer([CURRENT])
    job = _job(Queue("sig", redis_client=redis))
    assert SIGNATURE not in job.meta and not signer.verify(job)
    assert "carries no signature" in signer.refusal(job)
    for forged in ("é" * 64, 12345, "00"):  # compare_digest refuses non-ASCII text: verify must not raise
        bad = dataclasses.replace(job, meta={SIGNATURE: forged})
        assert not signer.verify(bad)
        assert "not 64 hex characters" in signer.refusal(bad)
    wrong = dataclasses.replace(job, meta={SIGNATURE: "0" * 64})
    assert not signer.verify(wrong) and "does not match" in signer.refusal(wrong)


def test_the_producer_keeps_its_own_meta_keys(redis):
    queue = Queue("sig", redis_client=redis, signing_key=CURRENT)
    with pytest.raises(ValueError, match="meta keys .*signature.* are the queue's own"):
        queue.add("echo", meta={SIGNATURE: "0" * 64})
    assert redis.xlen(QueueKeys.for_queue("sig").stream) == 0


# --- real workers ------------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_unsigned_forged_and_altered_jobs_never_run_and_are_counted(redis, workers):
    workers.start("signed", signing_key=[CURRENT, OLDER])
    workers.wait_ready(redis, "signed", 1)
    keys = QueueKeys.for_queue("signed")
    producer = Queue("signed", redis_client=redis, signing_key=CURRENT)
    outsider = Queue("signed", redis_client=redis)  # can write to Redis, holds no key

    genuine = producer.add("echo", ["pay 10"])
    unsigned = outsider.add("echo", ["pay 10000"])
    by_stranger = Queue("signed", redis_client=redis, signing_key=STRANGER).add("echo", ["pay 10000"])
    # a genuine envelope, its arguments changed and its signature kept
    altered = dataclasses.replace(_job(producer, "pay 10"), args=["pay 10000"])
    altered_id = redis.xadd(keys.stream, {"j": altered.encode()}).decode()
    # written by hand straight into the stream, with a made-up signature
    forged = Job(new_job_id(), "echo", ["pay 10000"], created_at=now_ms(), meta={SIGNATURE: "ab" * 32})
    forged_id = redis.xadd(keys.stream, {"j": forged.encode()}).decode()

    wait_for(lambda: redis.xlen(keys.dlq) >= 4 and read_runs(redis), 30, "four refusals and the genuine run")
    wait_for(lambda: settled(redis, "signed"), 10, "the queue to settle")
    time.sleep(0.3)  # a refused job that ran anyway would show up now

    assert [r.job_id for r in read_runs(redis)] == [genuine.job_id]
    dead = {e["source_id"].decode(): e for e in dlq_entries(redis, "signed")}
    assert set(dead) == {unsigned.entry_id, by_stranger.entry_id, altered_id, forged_id}
    assert {(e["reason"], e["error_class"]) for e in dead.values()} == {(b"bad_signature", b"BadSignature")}
    assert b"carries no signature" in dead[unsigned.entry_id]["error"]
    for entry_id in (by_stranger.entry_id, altered_id, forged_id):
        assert b"does not match" in dead[entry_id]["error"]
    assert dead[altered_id]["job_id"].decode() == altered.id, "the entry names the job for the operator"

    counted = totals.read_totals(redis, ["signed"])["signed"].counters
    assert counted["bad_signature"] == 4 and counted["dlq"] == 4 and counted["completed"] == 1
    _, seen = events.read_events(redis, "signed")
    assert sorted(e.job_id for e in seen if e.type == events.DLQ and e.reason == "bad_signature") == sorted(
        [unsigned.job_id, by_stranger.job_id, altered.id, forged.id])
    assert "refused" in workers.logs() and "(bad_signature)" in workers.logs()


@pytest.mark.timeout(90)
def test_jobs_signed_with_an_older_listed_key_run_and_retries_still_verify(redis, workers):
    """Rotation: producers moved to the new key while jobs signed with the old one wait or retry."""
    workers.start("rotate", signing_key=[CURRENT, OLDER], backoff_ms=20)
    workers.wait_ready(redis, "rotate", 1)
    old_producer = Queue("rotate", redis_client=redis, signing_key=OLDER)
    new_producer = Queue("rotate", redis_client=redis, signing_key=CURRENT)
    old = old_producer.add("echo", ["from before the rotation"])
    delayed = old_producer.add("echo", ["scheduled before the rotation"], delay=200)
    new = new_producer.add("echo", ["after"])
    # fails twice: each retry rewrites attempt and errors, and comes back through the delayed set
    flaky = new_producer.add("fail_n_times", [2], attempts=5)

    wait_for(lambda: len(read_runs(redis)) >= 6, 30, "six runs")
    wait_for(lambda: settled(redis, "rotate"), 10, "the queue to settle")
    runs = read_runs(redis)
    assert sorted(r.job_id for r in runs if r.job_id != flaky.job_id) == sorted(
        [old.job_id, delayed.job_id, new.job_id])
    assert [r.attempt for r in runs if r.job_id == flaky.job_id] == [1, 2, 3]
    assert dlq_entries(redis, "rotate") == []


@pytest.mark.timeout(90)
def test_replaying_a_bad_signature_entry_lands_it_in_the_dlq_again(redis, workers):
    workers.start("replay-signed", signing_key=[CURRENT])
    workers.wait_ready(redis, "replay-signed", 1)
    keys = QueueKeys.for_queue("replay-signed")
    sneaky = Queue("replay-signed", redis_client=redis).add("echo", ["sneaky"])
    wait_for(lambda: redis.xlen(keys.dlq) == 1, 20, "the refusal")
    dead = DeadLetters(redis, "replay-signed")
    [first] = dead.page(limit=10).items
    assert first.reason == "bad_signature" and first.job_id == sneaky.job_id

    assert dead.replay([first.entry_id]) == 1  # the operator's replay does not vouch for a payload
    wait_for(lambda: (redis.xlen(keys.dlq) == 1 and dead.page(limit=10).items[0].entry_id != first.entry_id), 20,
             "the replayed job to be refused again")
    wait_for(lambda: settled(redis, "replay-signed"), 10, "the queue to settle")
    [again] = dead.page(limit=10).items
    assert again.reason == "bad_signature" and again.job_id == sneaky.job_id and again.job.replays == 1
    assert read_runs(redis) == []
    counted = totals.read_totals(redis, ["replay-signed"])["replay-signed"].counters
    assert counted["bad_signature"] == 2 and counted["replayed"] == 1


@pytest.mark.timeout(90)
def test_a_worker_without_keys_runs_signed_and_unsigned_jobs_as_before(redis, workers):
    workers.start("unkeyed")
    workers.wait_ready(redis, "unkeyed", 1)
    signed = Queue("unkeyed", redis_client=redis, signing_key=CURRENT).add("echo", [1])
    plain = Queue("unkeyed", redis_client=redis).add("echo", [2])
    wait_for(lambda: len(read_runs(redis)) >= 2, 20, "both jobs to run")
    wait_for(lambda: settled(redis, "unkeyed"), 10, "the queue to settle")
    assert sorted(r.job_id for r in read_runs(redis)) == sorted([signed.job_id, plain.job_id])
    assert dlq_entries(redis, "unkeyed") == []
