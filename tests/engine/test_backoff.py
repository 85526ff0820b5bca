"""Backoff: the delay before each retry, as pure functions (no Redis needed)."""

import random

import pytest

from chasqui_core.engine.jobs import backoff
from chasqui_core.engine.jobs.backoff import (
    DEFAULT_BACKOFF,
    BackoffSpec,
    coerce_backoff,
    compute_delay_ms,
    register_strategy,
)
from chasqui_core.engine.jobs.errors import RetryAfter

DRAWS = 2000


def sample(spec, n, *, seed=1234, **kwargs):
    rng = random.Random(seed)
    return [spec.delay_ms(n, rng=rng, **kwargs) for _ in range(DRAWS)]


@pytest.fixture
def custom_strategies():
    """Names registered during a test are removed afterwards."""
    before = set(backoff._STRATEGIES)
    yield
    for name in set(backoff._STRATEGIES) - before:
        del backoff._STRATEGIES[name]


# --- default series -------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "low", "high"),
    [
        (1, 0, 200),
        (2, 100, 300),
        (3, 300, 500),
        (4, 700, 900),
        (9, 25_500, 25_700),
        (10, 29_900, 30_100),
        (11, 29_900, 30_100),
        (12, 29_900, 30_100),
        (50, 29_900, 30_100),
        (5000, 29_900, 30_100),  # no overflow for absurd retry numbers
    ],
)
def test_default_series_bounds(n, low, high):
    delays = sample(DEFAULT_BACKOFF, n)
    assert all(isinstance(d, int) for d in delays)
    assert low <= min(delays) and max(delays) <= high


@pytest.mark.parametrize("n", [2, 3, 4, 9, 10])
def test_default_jitter_uses_its_range(n):
    center = min(100 * 2 ** (n - 1), 30_000)
    delays = sample(DEFAULT_BACKOFF, n)
    assert min(delays) < center - 50
    assert max(delays) > center + 50


def test_first_retry_never_negative_and_reaches_zero_side():
    delays = sample(DEFAULT_BACKOFF, 1)
    assert min(delays) >= 0
    assert min(delays) < 50 and max(delays) > 150


def test_default_base_without_jitter():
    spec = BackoffSpec(jitter="none")
    assert [spec.delay_ms(n) for n in range(1, 12)] == [
        100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000,
    ]


def test_compute_delay_ms_none_means_default():
    a = compute_delay_ms(None, 3, rng=random.Random(7))
    b = DEFAULT_BACKOFF.delay_ms(3, rng=random.Random(7))
    assert a == b
    assert 300 <= a <= 500


def test_seeded_rng_is_deterministic():
    assert sample(DEFAULT_BACKOFF, 5, seed=42) == sample(DEFAULT_BACKOFF, 5, seed=42)


def test_module_random_is_used_without_rng():
    random.seed(99)
    first = [DEFAULT_BACKOFF.delay_ms(4) for _ in range(20)]
    random.seed(99)
    assert [DEFAULT_BACKOFF.delay_ms(4) for _ in range(20)] == first


@pytest.mark.parametrize("n", [0, -1])
def test_retry_number_starts_at_one(n):
    with pytest.raises(ValueError, match="first run"):
        DEFAULT_BACKOFF.delay_ms(n)


# --- strategies -----------------------------------------------------------------


def test_fixed():
    spec = BackoffSpec.fixed(1500)
    assert spec.strategy == "fixed" and spec.jitter == "none"
    assert {spec.delay_ms(n) for n in (1, 2, 10, 100)} == {1500}


def test_fixed_is_not_capped_by_max():
    assert BackoffSpec.fixed(60_000).delay_ms(3) == 60_000


def test_fixed_with_jitter():
    delays = sample(BackoffSpec(strategy="fixed", initial_ms=1000), 7)
    assert 900 <= min(delays) < 950 and 1050 < max(delays) <= 1100


def test_linear():
    spec = BackoffSpec(strategy="linear", initial_ms=250, max_ms=1000, jitter="none")
    assert [spec.delay_ms(n) for n in range(1, 7)] == [250, 500, 750, 1000, 1000, 1000]


def test_exponential_custom_multiplier():
    spec = BackoffSpec(initial_ms=10, multiplier=3, max_ms=10_000, jitter="none")
    assert [spec.delay_ms(n) for n in range(1, 5)] == [10, 30, 90, 270]


def test_multiplier_one_is_constant():
    spec = BackoffSpec(multiplier=1, jitter="none")
    assert {spec.delay_ms(n) for n in range(1, 20)} == {100}


def test_retry_after_honours_the_error():
    spec = BackoffSpec(strategy="retry_after")
    assert spec.delay_ms(1, error=RetryAfter(2.5)) == 2500
    # exact: no jitter, and not capped by max_ms (the server asked)
    assert {spec.delay_ms(3, error=RetryAfter(2.5), rng=random.Random(s)) for s in range(50)} == {2500}
    assert spec.delay_ms(1, error=RetryAfter(120)) == 120_000
    assert spec.delay_ms(1, error=RetryAfter(0)) == 0


def test_retry_after_falls_back_to_exponential():
    spec = BackoffSpec(strategy="retry_after")
    assert sample(spec, 3, error=ValueError("boom")) == sample(DEFAULT_BACKOFF, 3)
    assert sample(spec, 3) == sample(DEFAULT_BACKOFF, 3)


def test_other_strategies_ignore_retry_after():
    delays = sample(DEFAULT_BACKOFF, 2, error=RetryAfter(60))
    assert max(delays) <= 300


def test_custom_strategy(custom_strategies):
    seen = []

    def squares(spec, n, error):
        seen.append((spec, n, error))
        return spec.initial_ms * n * n

    register_strategy("squares", squares)
    spec = BackoffSpec(strategy="squares", initial_ms=10, jitter="none")
    err = KeyError("x")
    assert spec.delay_ms(4, error=err) == 160
    assert seen == [(spec, 4, err)]
    # jitter is applied on top of the custom base
    delays = sample(BackoffSpec(strategy="squares", initial_ms=10), 10)
    assert 900 <= min(delays) < 950 and 1050 < max(delays) <= 1100
    # and the name survives the envelope round trip
    assert BackoffSpec.from_dict(spec.to_dict()) == spec


def test_custom_strategy_can_be_replaced(custom_strategies):
    register_strategy("mine", lambda spec, n, error: 5)
    spec = BackoffSpec(strategy="mine", jitter="none")
    assert spec.delay_ms(1) == 5
    register_strategy("mine", lambda spec, n, error: 7)
    assert spec.delay_ms(1) == 7


def test_custom_strategy_bad_result(custom_strategies):
    register_strategy("broken", lambda spec, n, error: float("nan"))
    with pytest.raises(ValueError, match="broken"):
        BackoffSpec(strategy="broken").delay_ms(1)


@pytest.mark.parametrize("name", ["exponential", "fixed", "linear", "retry_after"])
def test_builtin_strategies_cannot_be_replaced(name):
    with pytest.raises(ValueError, match=name):
        register_strategy(name, lambda spec, n, error: 1)


def test_register_rejects_bad_arguments():
    with pytest.raises(ValueError):
        register_strategy("", lambda spec, n, error: 1)
    with pytest.raises(TypeError):
        register_strategy("not_callable", 5)


def test_unregistered_strategy_is_rejected():
    with pytest.raises(ValueError, match="'nope'") as info:
        BackoffSpec(strategy="nope")
    assert "exponential" in str(info.value) and "register_strategy" in str(info.value)


# --- jitter modes ---------------------------------------------------------------


def test_jitter_none():
    assert sample(BackoffSpec(jitter="none"), 4) == [800] * DRAWS


def test_jitter_symmetric_custom_width():
    delays = sample(BackoffSpec(jitter_ms=500), 4)  # base 800
    assert 300 <= min(delays) < 350 and 1250 < max(delays) <= 1300


def test_jitter_symmetric_never_negative():
    delays = sample(BackoffSpec(jitter_ms=1000), 1)  # base 100, range -900..1100
    assert min(delays) == 0 and max(delays) <= 1100


def test_jitter_full():
    delays = sample(BackoffSpec(jitter="full"), 4)  # base 800
    assert 0 <= min(delays) < 50 and 750 < max(delays) <= 800


def test_jitter_equal():
    delays = sample(BackoffSpec(jitter="equal"), 4)  # base 800
    assert 400 <= min(delays) < 450 and 750 < max(delays) <= 800


def test_jitter_percent():
    delays = sample(BackoffSpec(jitter="percent", jitter_percent=0.25), 4)  # 800 +/- 200
    assert 600 <= min(delays) < 620 and 980 < max(delays) <= 1000


def test_jitter_percent_after_cap():
    delays = sample(BackoffSpec(jitter="percent"), 12)  # 30 s +/- 10%
    assert 27_000 <= min(delays) < 27_500 and 32_500 < max(delays) <= 33_000


def test_jitter_decorrelated_without_previous():
    delays = sample(BackoffSpec(jitter="decorrelated"), 1)  # uniform(100, 300)
    assert 100 <= min(delays) < 120 and 280 < max(delays) <= 300


def test_jitter_decorrelated_uses_previous():
    spec = BackoffSpec(jitter="decorrelated")
    delays = sample(spec, 5, previous_ms=2000)  # uniform(100, 6000)
    assert 100 <= min(delays) < 200 and 5800 < max(delays) <= 6000
    # the retry number does not matter, only the previous delay
    assert sample(spec, 1, previous_ms=2000) == delays


def test_jitter_decorrelated_is_capped():
    spec = BackoffSpec(jitter="decorrelated", max_ms=5000)
    delays = sample(spec, 3, previous_ms=4000)  # uniform(100, 12000), capped at 5000
    assert min(delays) >= 100 and max(delays) == 5000


def test_jitter_decorrelated_short_previous_does_not_go_below_initial():
    delays = sample(BackoffSpec(jitter="decorrelated"), 2, previous_ms=0)
    assert min(delays) >= 100 and max(delays) <= 300


def test_decorrelated_chain_stays_in_bounds():
    spec = BackoffSpec(jitter="decorrelated", max_ms=10_000)
    rng = random.Random(3)
    previous = None
    for n in range(1, 200):
        previous = spec.delay_ms(n, previous_ms=previous, rng=rng)
        assert 100 <= previous <= 10_000


def test_unknown_jitter_is_rejected():
    with pytest.raises(ValueError, match="'wobbly'") as info:
        BackoffSpec(jitter="wobbly")
    assert "symmetric" in str(info.value)


# --- validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["initial_ms", "multiplier", "max_ms", "jitter_ms", "jitter_percent"]
)
@pytest.mark.parametrize("value", [-1, -0.001, float("nan"), float("inf")])
def test_numbers_must_be_finite_and_not_negative(field, value):
    with pytest.raises(ValueError, match=field):
        BackoffSpec(**{field: value})


@pytest.mark.parametrize("value", ["100", None, True])
def test_numbers_must_be_numbers(value):
    with pytest.raises(TypeError, match="initial_ms"):
        BackoffSpec(initial_ms=value)


def test_multiplier_below_one_rejected_for_exponential():
    with pytest.raises(ValueError, match="multiplier"):
        BackoffSpec(multiplier=0.5)
    with pytest.raises(ValueError, match="multiplier"):
        BackoffSpec(strategy="retry_after", multiplier=0.5)
    BackoffSpec(strategy="linear", multiplier=0.5)  # unused there, so allowed


def test_jitter_percent_at_most_one():
    with pytest.raises(ValueError, match="jitter_percent"):
        BackoffSpec(jitter="percent", jitter_percent=1.5)


def test_initial_above_max_rejected():
    with pytest.raises(ValueError, match="max_ms"):
        BackoffSpec(initial_ms=60_000)
    BackoffSpec(initial_ms=60_000, max_ms=60_000)


def test_numbers_are_stored_as_floats():
    spec = BackoffSpec(initial_ms=500, max_ms=1000)
    assert isinstance(spec.initial_ms, float)
    assert spec == BackoffSpec(initial_ms=500.0, max_ms=1000.0)


def test_spec_is_frozen():
    with pytest.raises(AttributeError):
        DEFAULT_BACKOFF.initial_ms = 5


# --- to_dict / from_dict ------------------------------------------------------------


def test_default_to_dict_is_empty():
    assert DEFAULT_BACKOFF.to_dict() == {}
    assert BackoffSpec.from_dict({}) == DEFAULT_BACKOFF


def test_to_dict_only_differences():
    assert BackoffSpec.fixed(1500).to_dict() == {"strategy": "fixed", "initial_ms": 1500, "jitter": "none"}
    assert BackoffSpec(jitter="percent", jitter_percent=0.25).to_dict() == {
        "jitter": "percent",
        "jitter_percent": 0.25,
    }
    # whole numbers become ints (smaller in msgpack); fractions stay floats
    assert BackoffSpec(initial_ms=12.5).to_dict() == {"initial_ms": 12.5}
    assert type(BackoffSpec.fixed(1500).to_dict()["initial_ms"]) is int


@pytest.mark.parametrize(
    "spec",
    [
        DEFAULT_BACKOFF,
        BackoffSpec.fixed(250),
        BackoffSpec(strategy="linear", initial_ms=12.5, max_ms=999.5),
        BackoffSpec(strategy="retry_after", multiplier=3, jitter="decorrelated"),
        BackoffSpec(jitter="percent", jitter_percent=0.33, jitter_ms=0),
        BackoffSpec(jitter="full", max_ms=1e12),
    ],
)
def test_round_trip(spec):
    data = spec.to_dict()
    assert BackoffSpec.from_dict(data) == spec
    assert all(key in backoff._DEFAULTS for key in data)


def test_from_dict_unknown_key():
    with pytest.raises(ValueError, match="initial"):
        BackoffSpec.from_dict({"initial": 100})


def test_from_dict_validates():
    with pytest.raises(ValueError, match="'nope'"):
        BackoffSpec.from_dict({"strategy": "nope"})
    with pytest.raises(TypeError):
        BackoffSpec.from_dict([("strategy", "fixed")])


# --- coerce_backoff -------------------------------------------------------------


def test_coerce_none_and_spec():
    assert coerce_backoff(None) is None
    spec = BackoffSpec(strategy="linear")
    assert coerce_backoff(spec) is spec


@pytest.mark.parametrize("value", [500, 500.0])
def test_coerce_number_is_fixed(value):
    assert coerce_backoff(value) == BackoffSpec.fixed(500)


def test_coerce_string_and_dict():
    assert coerce_backoff("linear") == BackoffSpec(strategy="linear")
    assert coerce_backoff({"strategy": "fixed", "initial_ms": 5}) == BackoffSpec(strategy="fixed", initial_ms=5)


@pytest.mark.parametrize("value", [True, False])
def test_coerce_bool_rejected(value):
    with pytest.raises(TypeError):
        coerce_backoff(value)


@pytest.mark.parametrize("value", [[100], (1, 2), object(), b"fixed"])
def test_coerce_other_types_rejected(value):
    with pytest.raises(TypeError, match="backoff must be"):
        coerce_backoff(value)


def test_coerce_bad_values():
    with pytest.raises(ValueError, match="'bogus'"):
        coerce_backoff("bogus")
    with pytest.raises(ValueError, match="'wobbly'"):
        coerce_backoff({"jitter": "wobbly"})
    with pytest.raises(ValueError, match="initial_ms"):
        coerce_backoff(-5)
