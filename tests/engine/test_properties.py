"""Properties of the engine's pure parts, checked on many generated inputs (hypothesis).

The example-based tests pin down chosen cases; these state what must hold
for every input: any valid job survives its envelope, a failed run's fast
encoding is the slow one's, decoding garbage only ever raises DecodeError,
backoff delays stay within the documented bounds, the retry decision never
goes past the budget, and a queue's keys share one hash tag and no other
queue's. None of them needs a server; each runs a bounded number of
examples so the file takes seconds.
"""

from __future__ import annotations

import math
import random

import msgpack
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from chasqui_core.engine.jobs.backoff import DEFAULT_BACKOFF, BackoffSpec
from chasqui_core.engine.jobs.envelope import MAX_RESULT_TTL, DecodeError, Job, decode, error_record
from chasqui_core.engine.jobs.errors import InvalidQueueName, RetryAfter, UnrecoverableError
from chasqui_core.engine.store.keys import BANDS, QueueKeys, validate_queue_name
from chasqui_core.engine.jobs.registry import Handler
from chasqui_core.engine.settle.retry import RetryPolicy, budget, decide

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- generators -------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20) | st.floats(
    allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
counters = st.integers(0, 2**63 - 1)
errors = st.builds(
    lambda attempt, cls, msg, started, took, backoff: error_record(
        attempt=attempt, exc_class=cls, message=msg, traceback="Traceback ...", worker="w-1",
        started_at=started, finished_at=started + took, backoff_ms=backoff),
    st.integers(1, 100), st.text(min_size=1, max_size=30), st.text(max_size=50), st.integers(0, 2**42),
    st.integers(0, 10**6), st.none() | st.integers(0, 10**6),
)
backoff_dicts = st.none() | st.just({}) | st.builds(lambda s: s.to_dict(), st.builds(
    BackoffSpec, strategy=st.sampled_from(["exponential", "fixed", "linear"]), initial_ms=st.integers(0, 1000),
    max_ms=st.integers(1000, 60_000), jitter=st.sampled_from(["none", "symmetric", "full"])))
jobs = st.builds(
    Job,
    id=st.text(min_size=1, max_size=30),
    task=st.text(min_size=1, max_size=40),
    args=st.lists(json_values, max_size=4),
    kwargs=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
    attempt=counters,
    created_at=counters,
    max_attempts=st.none() | st.integers(1, 2**31),
    backoff=backoff_dicts,
    errors=st.lists(errors, max_size=3),
    replays=counters,
    result_ttl=st.integers(0, MAX_RESULT_TTL),
    deaths=counters,
    meta=st.dictionaries(st.text(max_size=10), json_values, max_size=3),
)


def equal_json(a, b) -> bool:
    """Equality that tells 1 from 1.0 and True from 1, as a round trip must keep them apart."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(equal_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal_json(a[k], b[k]) for k in a)
    return a == b


def same_job(a: Job, b: Job) -> bool:
    return all(equal_json(getattr(a, f), getattr(b, f)) for f in Job.__slots__)


# --- the envelope -------------------------------------------------------------------------


@FAST
@given(jobs)
def test_every_valid_job_survives_its_envelope(job):
    assert same_job(decode(job.encode()), job)


@FAST
@given(jobs, st.integers(1, 2**40), errors, counters)
def test_a_failed_run_s_fast_encoding_is_the_copy_s_encoding(job, attempt, record, deaths):
    fast = job.encode_after_failure(attempt, record, deaths)
    assert fast == job.after_failure(attempt, record, deaths).encode()
    again = decode(fast)
    assert (again.attempt, again.deaths, again.errors[-1]) == (attempt, deaths, record)
    assert again.errors[:-1] == job.errors, "the earlier history is kept, in order"


def _decodes_or_refuses(data: bytes) -> None:
    try:
        job = decode(data)
    except DecodeError:
        return
    assert isinstance(job, Job)


@FAST
@given(st.binary(max_size=200))
def test_decoding_arbitrary_bytes_raises_nothing_but_decode_error(data):
    _decodes_or_refuses(data)


any_msgpack = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=5) | st.integers(-(2**63), 2**63 - 1), inner, max_size=4),
    max_leaves=20,
)


@FAST
@given(any_msgpack)
def test_decoding_any_msgpack_value_raises_nothing_but_decode_error(value):
    _decodes_or_refuses(msgpack.packb(value, use_bin_type=True))


@FAST
@given(st.lists(any_msgpack, min_size=14, max_size=14), st.booleans())
def test_decoding_a_fourteen_field_envelope_with_any_fields_raises_nothing_but_decode_error(fields, versioned):
    if versioned:
        fields[0] = 1
    _decodes_or_refuses(msgpack.packb(fields, use_bin_type=True))


@FAST
@given(jobs, st.sampled_from(["attempt", "replays", "deaths", "created_at", "result_ttl"]),
       st.sampled_from([-1, "3", 1.5, None, True, MAX_RESULT_TTL + 1]))
def test_a_counter_out_of_range_is_refused_naming_it(job, name, value):
    assume(not (name != "result_ttl" and value == MAX_RESULT_TTL + 1))
    raw = msgpack.unpackb(job.encode())
    raw[[None, "id", "task", "args", "kwargs", "attempt", "created_at", "max_attempts", "backoff", "errors",
         "replays", "result_ttl", "deaths", "meta"].index(name)] = value
    with pytest.raises(DecodeError, match=name):
        decode(msgpack.packb(raw, use_bin_type=True))


# --- backoff ------------------------------------------------------------------------------

specs = st.builds(
    BackoffSpec,
    strategy=st.sampled_from(["exponential", "fixed", "linear", "retry_after"]),
    initial_ms=st.floats(0, 10_000),
    multiplier=st.floats(1, 10),
    max_ms=st.floats(10_000, 120_000),
    jitter=st.sampled_from(["symmetric", "full", "equal", "decorrelated", "percent", "none"]),
    jitter_ms=st.floats(0, 5_000),
    jitter_percent=st.floats(0, 1),
)
retry_numbers = st.integers(1, 10_000)


def base_of(spec: BackoffSpec, n: int) -> float:
    """The documented base delay of retry ``n`` (docs/retries.md, "Strategies")."""
    if spec.strategy == "fixed":
        return spec.initial_ms
    if spec.strategy == "linear":
        return min(spec.initial_ms * n, spec.max_ms)
    if spec.initial_ms == 0:
        return 0.0  # nothing grows from 0, however high the retry number
    try:
        return min(spec.initial_ms * spec.multiplier ** (n - 1), spec.max_ms)
    except OverflowError:
        return spec.max_ms


@FAST
@given(specs, retry_numbers, st.none() | st.integers(0, 200_000), st.randoms(use_true_random=False))
def test_every_delay_is_a_whole_number_of_ms_within_its_jitter_mode_s_range(spec, n, previous, rng):
    delay = spec.delay_ms(n, previous_ms=previous, rng=rng)
    assert isinstance(delay, int) and delay >= 0
    base = base_of(spec, n)
    low, high = {
        "none": (base, base),
        "symmetric": (base - spec.jitter_ms, base + spec.jitter_ms),
        "full": (0, base),
        "equal": (base / 2, base),
        "percent": (base * (1 - spec.jitter_percent), base * (1 + spec.jitter_percent)),
        "decorrelated": (spec.initial_ms, max(spec.initial_ms,
                                              min(spec.max_ms, max(previous or 0, spec.initial_ms) * 3))),
    }[spec.jitter]
    # rounding to whole ms moves a delay by half a millisecond at most; never below 0
    assert max(0, math.floor(low - 0.5)) <= delay <= math.ceil(high + 0.5), (low, high)


@FAST
@given(specs, retry_numbers)
def test_a_capped_base_never_passes_max_ms(spec, n):
    no_jitter = BackoffSpec(spec.strategy, spec.initial_ms, spec.multiplier, spec.max_ms, "none")
    delay = no_jitter.delay_ms(n)
    if spec.strategy == "fixed":
        assert delay == round(spec.initial_ms)
    else:
        assert delay <= round(spec.max_ms)


@FAST
@given(specs, retry_numbers)
def test_without_jitter_exponential_and_linear_delays_never_shrink_from_one_retry_to_the_next(spec, n):
    assume(spec.strategy in ("exponential", "linear", "retry_after"))
    no_jitter = BackoffSpec(spec.strategy, spec.initial_ms, spec.multiplier, spec.max_ms, "none")
    assert no_jitter.delay_ms(n) <= no_jitter.delay_ms(n + 1)


@FAST
@given(retry_numbers, st.randoms(use_true_random=False))
def test_the_default_delay_is_the_documented_table(n, rng):
    base = min(100 * 2 ** min(n - 1, 64), 30_000)
    delay = DEFAULT_BACKOFF.delay_ms(n, rng=rng)
    assert base - 100 <= delay <= base + 100
    assert delay <= 30_100


@FAST
@given(specs, st.floats(0, 100_000), retry_numbers)
def test_retry_after_is_honoured_exactly_and_uncapped_only_by_its_strategy(spec, seconds, n):
    delay = spec.delay_ms(n, error=RetryAfter(seconds), rng=random.Random(0))
    if spec.strategy == "retry_after":
        assert delay == round(seconds * 1000)
    else:
        assert delay == spec.delay_ms(n, error=None, rng=random.Random(0))


@FAST
@given(specs)
def test_a_spec_survives_its_dict(spec):
    assert BackoffSpec.from_dict(spec.to_dict()) == spec


# --- the retry decision -------------------------------------------------------------------

layer = st.none() | st.integers(1, 20)


def a_job(max_attempts: int | None, errors_: list | None = None) -> Job:
    return Job("j1", "t", max_attempts=max_attempts, errors=errors_ or [])


def a_handler(max_attempts: int | None) -> Handler:
    return Handler("t", lambda: None, is_async=False, max_attempts=max_attempts, backoff=BackoffSpec.fixed(5))


class Boom(Exception):
    pass


class Fatal(UnrecoverableError):
    pass


ForeignUnrecoverable = type("UnrecoverableError", (Exception,), {})
"""Another library's class of that name: it counts too (the check is by name)."""


@FAST
@given(layer, layer, st.integers(1, 20))
def test_the_budget_comes_from_the_job_then_the_task_then_the_worker(per_job, per_task, per_worker):
    expected = per_job or per_task or per_worker
    assert budget(a_job(per_job), a_handler(per_task), RetryPolicy(max_attempts=per_worker)) == expected
    assert budget(a_job(per_job), None, RetryPolicy(max_attempts=per_worker)) == (per_job or per_worker)


@FAST
@given(layer, layer, st.integers(1, 20), st.integers(1, 60))
def test_decide_retries_exactly_while_runs_remain(per_job, per_task, per_worker, runs_made):
    job, handler, policy = a_job(per_job), a_handler(per_task), RetryPolicy(max_attempts=per_worker)
    decision = decide(job, Boom("x"), runs_made, handler, policy)
    spent = runs_made >= budget(job, handler, policy)
    assert decision.retry is not spent
    assert decision.reason == ("retries_exhausted" if spent else "")
    if decision.retry:
        assert decision.delay_ms >= 0


@FAST
@given(layer, layer, st.integers(1, 20), st.integers(1, 60),
       st.sampled_from([UnrecoverableError, Fatal, ForeignUnrecoverable]))
def test_an_unrecoverable_error_is_never_retried(per_job, per_task, per_worker, runs_made, cls):
    decision = decide(a_job(per_job), cls("no"), runs_made, a_handler(per_task), RetryPolicy(per_worker))
    assert (decision.retry, decision.reason) == (False, "unrecoverable")


# --- the key layout -----------------------------------------------------------------------

queue_names = st.from_regex(r"\A[A-Za-z0-9_.\-]{1,100}\Z")


def all_keys(keys: QueueKeys) -> list[str]:
    """Every key (and key prefix) of a queue, its priority bands' streams and start journals included."""
    own = [getattr(keys, f) for f in QueueKeys.__slots__ if f not in ("queue", "band", "rank")]
    bands = [keys.in_band(band) for band in BANDS]
    return own + [b.stream for b in bands] + [b.running("w") for b in bands]


def hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: between the first '{' and the next '}'."""
    start = key.index("{")
    return key[start + 1:key.index("}", start + 1)]


@FAST
@given(queue_names)
def test_every_key_of_a_queue_shares_its_one_hash_tag(name):
    keys = QueueKeys.for_queue(name)
    assert {hash_tag(k) for k in all_keys(keys)} == {f"chasqui:{name}"}


@FAST
@given(queue_names, queue_names)
def test_two_queues_never_share_a_key_nor_a_key_prefix(a, b):
    assume(a != b)
    ka, kb = all_keys(QueueKeys.for_queue(a)), all_keys(QueueKeys.for_queue(b))
    assert not set(ka) & set(kb)
    assert not any(x.startswith(y) or y.startswith(x) for x in ka for y in kb), \
        "a prefix (result:, done:...) of one queue must not cover another queue's keys"


@FAST
@given(st.text(max_size=120))
@example("emails\n")  # a regex's "$" matches before a final newline; the name must end where its letters do
def test_a_name_is_either_valid_or_refused_with_invalid_queue_name(name):
    valid = 1 <= len(name) <= 100 and all(c.isascii() and (c.isalnum() or c in "_.-") for c in name)
    if valid:
        assert validate_queue_name(name) == name
        assert QueueKeys.for_queue(name).queue == name
    else:
        with pytest.raises(InvalidQueueName):
            validate_queue_name(name)
        with pytest.raises(InvalidQueueName):
            QueueKeys.for_queue(name)
