"""Admission, what becomes of each entry a worker reads, against a real server: the entries are written and read
with XREADGROUP as a worker reads them, and what admission refuses is found in the dead-letter queue with the
reason an operator reads there."""

from __future__ import annotations

import msgpack
import pytest

from chasqui_core.engine.worker.admission import Admission
from chasqui_core.engine.store.connection import aconnect
from chasqui_core.engine.worker.delivery import ref_of
from chasqui_core.engine.jobs.envelope import DecodeError, Job, decode, new_job_id, now_ms
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.store.keys import GROUP, QueueKeys
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.jobs.registry import HandlerRegistry
from chasqui_core.engine.settle.retry import RECOVERIES_BEFORE_PANIC, RetryPolicy
from chasqui_core.engine.worker.limits import Limits, parse_limits
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.jobs.signing import SIGNATURE, Signer

QUEUE = "admit"


def envelope(task: str = "t.ok", **fields) -> bytes:
    """An envelope as a producer (or a retry, with ``attempt``) writes it."""
    return Job(id=new_job_id(), task=task, created_at=now_ms(), **fields).encode()


def read(redis, *fields_list: dict) -> list:
    """Write entries to the queue's stream and read them as a worker does (raw fields lists, as the reader gets)."""
    keys = QueueKeys.for_queue(QUEUE)
    redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    for fields in fields_list:
        redis.xadd(keys.stream, fields)
    [[_, entries]] = redis.xreadgroup(GROUP, "w-admit", {keys.stream: ">"})
    return [(entry_id, [x for pair in fields.items() for x in pair]) for entry_id, fields in entries]


async def admitted(redis_url, entries, *, max_payload_bytes=10_000, signer=None, held=None, registry=None,
                   default_timeout=None, policy=None, limits=None):
    client = aconnect(redis_url)
    settler = Settler(client, Scripts(client), worker_id="w-admit")
    if registry is None:
        registry = HandlerRegistry()
        registry.register("t.ok", lambda: None)
    held = held if held is not None else InFlight()
    policy = policy or RetryPolicy()
    admission = Admission(registry, Outcomes(settler, policy, "w-admit"), policy, held,
                          signer=signer, max_payload_bytes=max_payload_bytes, default_timeout=default_timeout,
                          limits=limits)
    deliveries = admission.admit(QueueKeys.for_queue(QUEUE), entries)
    await settler.flush()
    await client.aclose()
    return deliveries, held, admission


def dead_reasons(redis) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in redis.xrange(QueueKeys.for_queue(QUEUE).dlq)]


@pytest.mark.asyncio
async def test_a_well_formed_entry_becomes_a_held_delivery_named_by_its_stream_and_entry_id(redis, redis_url):
    entries = read(redis, {"j": envelope(args=[1, 2])})
    [d], held, _ = await admitted(redis_url, entries)
    keys = QueueKeys.for_queue(QUEUE)
    assert d.ref == ref_of(keys.stream, entries[0][0]) and held.holds(d) and len(held) == 1
    assert d.job.task == "t.ok" and d.job.args == [1, 2] and d.max_attempts == 3
    assert dead_reasons(redis) == []


@pytest.mark.asyncio
async def test_what_cannot_run_is_refused_with_its_reason_and_the_rest_of_the_batch_goes_on(redis, redis_url):
    entries = read(redis,
                   {"j": b"\x93not an envelope"},
                   {"j": envelope(args=["x" * 2_000])},
                   {"j": envelope("t.unknown")},
                   {"other": b"field"},
                   {"j": envelope(max_attempts=2, attempt=2)},
                   {"j": envelope()})
    deliveries, held, _ = await admitted(redis_url, entries, max_payload_bytes=1_000)
    assert [d.job.task for d in deliveries] == ["t.ok"] and len(held) == 1
    assert dead_reasons(redis) == ["decode_failed", "oversize", "unknown_task", "decode_failed", "invalid"]


@pytest.mark.asyncio
async def test_an_entry_read_again_while_held_is_counted_and_the_held_delivery_goes_on(redis, redis_url):
    entries = read(redis, {"j": envelope()})
    [first], held, _ = await admitted(redis_url, entries)
    again, held, admission = await admitted(redis_url, entries, held=held)
    assert again == [] and held.holds(first) and admission.skipped == 1
    assert dead_reasons(redis) == []


@pytest.mark.asyncio
async def test_with_signing_keys_an_unsigned_job_is_refused_before_its_task_is_looked_up(redis, redis_url):
    entries = read(redis, {"j": envelope("t.unknown")})
    deliveries, held, _ = await admitted(redis_url, entries, signer=Signer(["k" * 32]))
    assert deliveries == [] and len(held) == 0
    assert dead_reasons(redis) == ["bad_signature"]


def dead_entries(redis) -> list[dict[str, str]]:
    """The dead-letter entries as an operator reads them: what was refused, where from, and why, in words."""
    return [{k.decode(): v.decode(errors="replace") for k, v in fields.items()
             if k in (b"reason", b"source_id", b"task", b"job_id", b"error_class", b"error")}
            for _, fields in redis.xrange(QueueKeys.for_queue(QUEUE).dlq)]


@pytest.mark.asyncio
async def test_each_refusal_names_its_entry_its_job_and_why_in_words(redis, redis_url):
    keys = QueueKeys.for_queue(QUEUE)
    unknown = Job(id=new_job_id(), task="t.unknown", created_at=now_ms())
    idem = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), meta={"idempotency_key": ""})
    timed = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), meta={"timeout": -1})
    spent = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), max_attempts=2, attempt=2,
                errors=[{"class": "ValueError"}, {"class": "KeyError"}])
    big = envelope(args=["x" * 2_000])
    entries = read(redis, {"j": b"\x93not an envelope"}, {"j": big}, {"j": unknown.encode()},
                   {"j": idem.encode()}, {"j": timed.encode()}, {"j": spent.encode()})
    deliveries, held, _ = await admitted(redis_url, entries, max_payload_bytes=1_000)
    assert deliveries == [] and len(held) == 0
    ids = [e.decode() for e, _ in entries]
    got = dead_entries(redis)
    assert [e["source_id"] for e in got] == ids
    with pytest.raises(DecodeError) as undecodable:
        decode(b"\x93not an envelope")
    assert got[0]["reason"] == "decode_failed" and got[0]["error_class"] == "DecodeError"
    assert got[0]["error"] == str(undecodable.value), "the decoder's own words"
    assert got[1] == {"reason": "oversize", "source_id": ids[1], "task": "", "job_id": "",
                      "error_class": "PayloadTooLarge",
                      "error": f"payload is {len(big)} bytes; this worker accepts at most 1000"}
    assert got[2] == {"reason": "unknown_task", "source_id": ids[2], "task": "t.unknown", "job_id": unknown.id,
                      "error_class": "UnknownTask", "error": "no task named 't.unknown' is registered in this worker"}
    assert got[3]["reason"] == "decode_failed" and got[3]["error_class"] == "DecodeError"
    assert got[3]["job_id"] == idem.id and "meta['idempotency_key'] must be a non-empty string" in got[3]["error"]
    assert got[4]["reason"] == "decode_failed" and got[4]["error_class"] == "DecodeError"
    assert got[4]["job_id"] == timed.id and got[4]["error"].startswith("malformed envelope: timeout must be")
    assert got[5] == {"reason": "retries_exhausted", "source_id": ids[5], "task": "t.ok", "job_id": spent.id,
                      "error_class": "KeyError",
                      "error": "its budget is now 2 runs and it has made 2: no run is left "
                               "(the budget was lowered since it was retried)"}
    payloads = [fields[b"j"] for _, fields in redis.xrange(keys.dlq)]
    assert payloads[1:3] == [big, unknown.encode()], "the entry's own payload is kept for a replay"


@pytest.mark.asyncio
async def test_an_entry_read_as_a_dict_or_a_list_of_fields_is_admitted_alike(redis, redis_url):
    entries = read(redis, {"j": envelope(args=[1])}, {"j": envelope(args=[2]), "x": b"extra"})
    as_dicts = [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in entries]
    by_list, _, _ = await admitted(redis_url, entries)
    by_dict, _, _ = await admitted(redis_url, as_dicts)
    assert [d.job.args for d in by_list] == [d.job.args for d in by_dict] == [[1], [2]]
    assert [d.entry_id for d in by_list] == [d.entry_id for d in by_dict] == [e for e, _ in entries]
    assert dead_reasons(redis) == []


@pytest.mark.asyncio
async def test_an_entry_without_a_job_is_kept_in_the_dlq_with_its_fields_and_the_batch_goes_on(redis, redis_url):
    entries = read(redis, {"other": b"field"}, {"j": envelope(args=[3])})
    entries.insert(1, (b"1-1", None))  # deleted while pending: nothing to refuse, nothing to run
    deliveries, _, _ = await admitted(redis_url, entries)
    assert [d.job.args for d in deliveries] == [[3]]
    [foreign] = dead_entries(redis)
    assert (foreign["reason"], foreign["source_id"], foreign["error_class"]) == (
        "decode_failed", entries[0][0].decode(), "DecodeError")
    [(_, kept)] = redis.xrange(QueueKeys.for_queue(QUEUE).dlq)
    assert msgpack.unpackb(kept[b"j"]) == {"other": b"field"}, "the entry's own fields, for whoever wrote it"


@pytest.mark.asyncio
async def test_a_payload_at_the_size_limit_is_admitted(redis, redis_url):
    payload = envelope()
    entries = read(redis, {"j": payload})
    [d], _, _ = await admitted(redis_url, entries, max_payload_bytes=len(payload))
    assert d.payload == payload and d.job.id == d.job.id


@pytest.mark.asyncio
async def test_runs_lost_with_a_worker_are_charged_once_before_the_rules_look(redis, redis_url):
    lost = b"w-dead\t1000\t2000\tdied\nw-cut\t3000\t4000\tcontact"
    job = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), attempt=1, errors=[{"class": "ValueError"}],
              max_attempts=5)
    entries = read(redis, {"j": job.encode(), "lost": lost})
    [d], _, _ = await admitted(redis_url, entries)
    assert (d.job.attempt, d.job.deaths) == (3, 1)
    assert [(e["class"], e.get("attempt")) for e in d.job.errors] == [("ValueError", None), ("WorkerLost", 2),
                                                                  ("LostContact", 3)]
    assert decode(d.payload).attempt == 3, "the payload it runs (and settles) carries the charge"


@pytest.mark.asyncio
async def test_a_lost_run_that_spends_the_budget_ends_the_job_as_its_worker_lost(redis, redis_url):
    job = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), max_attempts=1)
    entries = read(redis, {"j": job.encode(), "lost": b"w-dead\t1000\t2000\tdied"})
    deliveries, _, _ = await admitted(redis_url, entries)
    assert deliveries == []
    [dead] = dead_entries(redis)
    assert (dead["reason"], dead["error_class"], dead["job_id"]) == ("retries_exhausted", "WorkerLost", job.id)
    assert dead["error"] == "its worker died during run 1 of 1; no run is left"


@pytest.mark.asyncio
async def test_a_job_taken_back_from_too_many_workers_is_a_panic_and_one_fewer_runs(redis, redis_url):
    too_often = Job(id=new_job_id(), task="t.ok", created_at=now_ms())
    once_less = Job(id=new_job_id(), task="t.ok", created_at=now_ms())
    entries = read(redis, {"j": too_often.encode(), "recovered": str(RECOVERIES_BEFORE_PANIC).encode()},
                   {"j": once_less.encode(), "recovered": str(RECOVERIES_BEFORE_PANIC - 1).encode()},
                   {"j": envelope(), "recovered": b"not a count"})
    deliveries, _, _ = await admitted(redis_url, entries)
    assert [d.job.id for d in deliveries][0] == once_less.id and len(deliveries) == 2
    [dead] = dead_entries(redis)
    assert (dead["reason"], dead["error_class"], dead["job_id"]) == ("panic", "WorkerLost", too_often.id)


@pytest.mark.asyncio
async def test_a_job_recovered_from_a_dead_worker_or_charged_a_death_is_a_suspect_and_no_other_is(redis, redis_url):
    """A suspect runs alone (suspects.py): a job taken back from a worker that died in its round of starts
    (``recovered``), or one already charged a death, and only those."""
    recovered = Job(id=new_job_id(), task="t.ok", created_at=now_ms())
    lost = {"class": "chasqui_core.engine.jobs.errors.WorkerLost"}
    died = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), attempt=1, deaths=1, errors=[lost])
    plain = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), attempt=1, errors=[{"class": "ValueError"}])
    entries = read(redis, {"j": recovered.encode(), "recovered": b"1"}, {"j": died.encode()},
                   {"j": plain.encode(), "recovered": b"0"})
    deliveries, _, _ = await admitted(redis_url, entries)
    assert [(d.job.id, d.suspect) for d in deliveries] == [(recovered.id, True), (died.id, True), (plain.id, False)]


@pytest.mark.asyncio
async def test_the_budget_and_timeout_are_the_job_s_then_the_task_s_then_the_worker_s(redis, redis_url):
    registry = HandlerRegistry()
    registry.register("t.ok", lambda: None)
    registry.register("t.slow", lambda: None, timeout=30, max_attempts=4)
    entries = read(redis, {"j": envelope()}, {"j": envelope("t.slow")}, {"j": envelope("t.slow", meta={"timeout": 5})},
                   {"j": envelope("t.slow", max_attempts=2)})
    plain, slow, own, capped = (await admitted(redis_url, entries, registry=registry, default_timeout=60,
                                               policy=RetryPolicy(max_attempts=7)))[0]
    assert (plain.timeout, slow.timeout, own.timeout) == (60, 30, 5)
    assert (plain.max_attempts, slow.max_attempts, capped.max_attempts) == (7, 4, 2)
    assert plain.handler is registry.get("t.ok") and slow.handler is registry.get("t.slow")


@pytest.mark.asyncio
async def test_a_job_with_an_idempotency_key_carries_its_marker_and_one_without_none(redis, redis_url):
    entries = read(redis, {"j": envelope(meta={"idempotency_key": "order-7"})}, {"j": envelope()})
    keyed, plain = (await admitted(redis_url, entries))[0]
    assert (keyed.idempotency_key, plain.idempotency_key) == ("order-7", None)


@pytest.mark.asyncio
async def test_every_entry_read_again_while_held_is_counted_logged_and_the_rest_goes_on(redis, redis_url, caplog):
    entries = read(redis, {"j": envelope()}, {"j": envelope()})
    _, held, _ = await admitted(redis_url, entries[:1])
    with caplog.at_level("WARNING", logger="chasqui.worker"):
        again, held, admission = await admitted(redis_url, [entries[0], entries[0], entries[1]], held=held)
    assert [d.entry_id for d in again] == [entries[1][0]] and admission.skipped == 2
    assert (f"entry {entries[0][0].decode()} on {QUEUE} was read again while this worker holds it; the held "
            "delivery goes on") in caplog.text


@pytest.mark.asyncio
async def test_with_signing_keys_a_signed_job_is_admitted_and_a_refused_one_does_not_stop_the_batch(redis, redis_url):
    signer = Signer(["k" * 32])
    signed = Job(id=new_job_id(), task="t.ok", created_at=now_ms())
    signed.meta = {SIGNATURE: signer.sign(signed.id, signed.task, signed.args, signed.kwargs, signed.created_at)}
    unsigned = Job(id=new_job_id(), task="t.ok", created_at=now_ms())
    entries = read(redis, {"j": unsigned.encode()}, {"j": signed.encode()})
    deliveries, _, _ = await admitted(redis_url, entries, signer=signer)
    assert [d.job.id for d in deliveries] == [signed.id]
    [dead] = dead_entries(redis)
    assert (dead["reason"], dead["error_class"], dead["job_id"], dead["source_id"]) == (
        "bad_signature", "BadSignature", unsigned.id, entries[0][0].decode())


@pytest.mark.asyncio
async def test_lost_runs_and_recoveries_are_read_from_an_entry_given_as_a_dict_too(redis, redis_url):
    job = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), max_attempts=5, replays=2)
    entries = read(redis, {"j": job.encode(), "lost": b"w-dead\t1000\t2000\tdied"},
                   {"j": envelope(), "recovered": str(RECOVERIES_BEFORE_PANIC).encode()})
    as_dicts = [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in entries]
    [d], _, _ = await admitted(redis_url, as_dicts)
    assert (d.job.attempt, d.job.deaths) == (1, 1) and d.job.errors[-1]["replays"] == 2
    assert dead_reasons(redis) == ["panic"]


@pytest.mark.asyncio
async def test_a_job_lost_at_its_second_death_is_a_poison_pill(redis, redis_url):
    job = Job(id=new_job_id(), task="t.ok", created_at=now_ms(), max_attempts=5, attempt=1, deaths=1,
              errors=[{"class": "WorkerLost"}])
    entries = read(redis, {"j": job.encode(), "lost": b"w-dead\t1000\t2000\tdied"})
    assert (await admitted(redis_url, entries))[0] == []
    [dead] = dead_entries(redis)
    assert (dead["reason"], dead["error"]) == ("panic", "the job was running when its worker died 2 times")


@pytest.mark.asyncio
async def test_a_job_under_a_limit_carries_its_buckets_and_one_under_none_carries_none(redis, redis_url):
    registry = HandlerRegistry()
    registry.register("t.ok", lambda: None)
    registry.register("t.capped", lambda: None)
    limits = Limits(parse_limits({"t.capped": {"concurrency": 1}}), [QUEUE])
    entries = read(redis, {"j": envelope("t.capped")}, {"j": envelope()})
    capped, free = (await admitted(redis_url, entries, registry=registry, limits=limits))[0]
    assert capped.limits == limits.buckets(QueueKeys.for_queue(QUEUE), capped.job) and capped.limits
    assert free.limits is None


@pytest.mark.asyncio
async def test_duplicates_past_the_log_budget_are_summed_up_in_one_line(redis, redis_url, caplog):
    entries = read(redis, {"j": envelope()})
    _, held, _ = await admitted(redis_url, entries)
    with caplog.at_level("INFO", logger="chasqui.worker"):
        _, _, admission = await admitted(redis_url, entries * 30, held=held)
        admission.summarise_logs()
    assert admission.skipped == 30
    assert "more entries read twice while held since the last such line" in caplog.text
