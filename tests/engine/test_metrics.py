"""Counter time series read from the engine's time-bucketed hashes."""

import pytest

from chasqui_core.engine.ops import metrics
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.ops.metrics import FIELDS, Series
from chasqui_core.engine.producer.queue import JobSpec, Queue

NOW = 1_700_000_123_456  # an epoch ms inside second 1_700_000_123 and minute 28_333_335


def bucket(client, queue, kind, index, **counts):
    keys = QueueKeys.for_queue(queue)
    prefix = keys.second_counters if kind == "s" else keys.minute_counters
    client.hset(f"{prefix}{index}", mapping=counts)


def make_series(values, field="retried", step_ms=1000):
    points = {f: [0] * len(values) for f in FIELDS}
    points[field] = list(values)
    return Series("q", "second", 0, step_ms, points)


def test_enqueued_counter_from_real_adds(redis):
    q = Queue("mail", redis_client=redis)
    q.add_bulk([JobSpec("t", [i]) for i in range(7)])
    q.add("t", delay=60_000)
    q.add("t", job_id="same")
    q.add("t", job_id="same")  # a duplicate is not counted

    s = metrics.series(redis, "mail", window=120)
    assert len(s.points["enqueued"]) == 120
    assert s.total("enqueued") == 9
    assert s.total("completed") == 0
    m = metrics.series(redis, "mail", resolution="minute", window=5)
    assert m.total("enqueued") == 9 and m.step_ms == 60_000


def test_default_windows(redis):
    assert len(metrics.series(redis, "q").points["failed"]) == 3600
    assert len(metrics.series(redis, "q", resolution="minute").points["failed"]) == 1440


def test_buckets_align_and_missing_ones_are_zero(redis):
    sec = NOW // 1000
    bucket(redis, "q", "s", sec, enqueued=5, retried=2)
    bucket(redis, "q", "s", sec - 3, completed=4, unknown_field=99)
    bucket(redis, "q", "s", sec - 10, completed=1000)  # outside the window
    bucket(redis, "q", "s", sec + 1, completed=1000)  # after now

    s = metrics.series(redis, "q", window=10, now_ms=NOW)
    assert (s.queue, s.resolution, s.step_ms) == ("q", "second", 1000)
    assert s.start_ms == (sec - 9) * 1000
    assert set(s.points) == set(FIELDS)
    assert s.points["enqueued"] == [0] * 9 + [5]
    assert s.points["retried"] == [0] * 9 + [2]
    assert s.points["completed"] == [0] * 6 + [4] + [0] * 3
    assert s.points["dlq"] == [0] * 10
    assert s.total("completed") == 4


def test_minute_resolution(redis):
    minute = NOW // 60_000
    bucket(redis, "q", "m", minute, failed=3)
    bucket(redis, "q", "m", minute - 2, failed=6, dlq=1)
    bucket(redis, "q", "s", NOW // 1000, failed=500)  # a second bucket must not leak in

    s = metrics.series(redis, "q", resolution="minute", window=3, now_ms=NOW)
    assert s.start_ms == (minute - 2) * 60_000
    assert s.points["failed"] == [6, 0, 3]
    assert s.points["dlq"] == [1, 0, 0]
    assert s.rate("failed", last_n=3) == pytest.approx(9 / 180)


def test_multi_series_matches_single_calls(redis):
    sec = NOW // 1000
    bucket(redis, "a", "s", sec, completed=1)
    bucket(redis, "b", "s", sec - 1, completed=2, promoted=3)
    both = metrics.multi_series(redis, ["a", "b", "c"], window=5, now_ms=NOW)
    assert list(both) == ["a", "b", "c"]
    for name in ("a", "b", "c"):
        assert both[name] == metrics.series(redis, name, window=5, now_ms=NOW)
    assert both["b"].points["promoted"] == [0, 0, 0, 3, 0]
    assert both["c"].total("completed") == 0
    assert metrics.multi_series(redis, [], window=5) == {}


@pytest.mark.parametrize("kwargs, words", [
    ({"resolution": "hour"}, "Unknown resolution 'hour'"),
    ({"resolution": None}, "Unknown resolution"),
    ({"window": 0}, "window must be"),
    ({"window": -5}, "window must be"),
    ({"window": 3721}, "from 1 to 3720"),
    ({"resolution": "minute", "window": 1501}, "from 1 to 1500"),
    ({"window": "60"}, "window must be"),
    ({"window": True}, "window must be"),
    ({"window": 2.5}, "window must be"),
])
def test_bad_arguments_raise_value_error(redis, kwargs, words):
    with pytest.raises(ValueError, match=words):
        metrics.series(redis, "q", **kwargs)


def test_unknown_field_and_bad_last_n():
    s = make_series([1, 2, 3])
    with pytest.raises(ValueError, match="Unknown counter 'nope'"):
        s.total("nope")
    with pytest.raises(ValueError, match="last_n"):
        s.rate("retried", last_n=0)


def test_rate_is_per_second():
    s = make_series([10, 0, 4, 6])
    assert s.rate("retried", last_n=2) == pytest.approx(5.0)
    assert s.rate("retried", last_n=100) == pytest.approx(5.0)
    assert make_series([120, 60], step_ms=60_000).rate("retried", last_n=2) == pytest.approx(1.5)


def test_spike_when_recent_rate_well_above_baseline():
    assert metrics.spike(make_series([1] * 300 + [5] * 10)) is True
    # from nothing to a steady stream is a spike too
    assert metrics.spike(make_series([0] * 300 + [2] * 10)) is True


def test_no_spike_cases():
    # the same rate as before
    assert metrics.spike(make_series([4] * 310)) is False
    # higher, but not by the factor
    assert metrics.spike(make_series([2] * 300 + [5] * 10)) is False
    # many times the baseline, but below the minimum rate
    assert metrics.spike(make_series([0] * 300 + [0, 1] * 5)) is False
    # no baseline to compare with
    assert metrics.spike(make_series([50] * 10)) is False
    # another field spiking does not count
    s = make_series([0] * 300 + [9] * 10, field="failed")
    assert metrics.spike(s) is False and metrics.spike(s, "failed") is True


def test_spike_options():
    s = make_series([1] * 50 + [3] * 5)
    assert metrics.spike(s, recent=5, baseline=50) is True
    assert metrics.spike(s, recent=5, baseline=50, factor=4) is False
    assert metrics.spike(s, recent=5, baseline=50, min_rate=3.5) is False
    with pytest.raises(ValueError, match="recent"):
        metrics.spike(s, recent=0)


def test_spike_on_real_counters(redis):
    sec = NOW // 1000
    for i in range(300):
        bucket(redis, "q", "s", sec - 10 - i, retried=1)
    for i in range(10):
        bucket(redis, "q", "s", sec - i, retried=8)
    s = metrics.series(redis, "q", window=310, now_ms=NOW)
    assert s.total("retried") == 300 + 80
    assert metrics.spike(s) is True
    assert metrics.spike(s, factor=10) is False
