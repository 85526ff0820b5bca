"""A queue's history over time ranges (engine/ops/history.py, rollup.lua): snapshots and per-task figures."""

import pytest

from chasqui_core.engine.ops import history, totals
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import Scripts
from tests.helpers import keys_matching


def _settle(redis, keys: QueueKeys, tasks, durations, failed=()):
    """What settle.lua adds for a batch: the histogram increments (failures per task among them)."""
    flat = totals.duration_increments(list(tasks), list(durations), list(failed))
    for field, amount in zip(flat[::2], flat[1::2], strict=True):
        redis.hincrby(keys.durations, field, amount)
    if failed:
        redis.hincrby(keys.totals, "failed", len(failed))


def test_failures_per_task_come_with_the_histogram_increments():
    flat = totals.duration_increments(["a", "a", "b"], [3, 700, 40], ["a"])
    assert flat[-2:] == ["fail:a", 1]
    parsed = totals.histograms(dict(zip(flat[::2], flat[1::2], strict=True)))
    assert (parsed["a"].count, parsed["a"].failures, parsed["b"].failures) == (2, 1, 0)
    assert totals.duration_increments(["a"], [3]) == ["5:a", 1, "sum:a", 3], "no failure, no extra field"


def test_a_snapshot_is_taken_once_per_period_and_ranges_count_from_it(redis):
    keys = QueueKeys.for_queue("h-q")
    scripts = Scripts(redis)
    _settle(redis, keys, ["send"] * 4, [3, 3, 3, 3], failed=["send"])
    assert history.snapshot(scripts, keys) == 2  # the 5-minute and the hourly one
    assert history.snapshot(scripts, keys) == 0, "the period's snapshots exist: nothing is written again"
    snaps = keys_matching(redis, f"{keys.metrics}snap:*")
    assert len(snaps) == 2 and all(0 < redis.ttl(k) <= 8 * 24 * 3600 + 3600 for k in snaps)
    # runs after the snapshot: a range starting at it counts only these
    _settle(redis, keys, ["send"] * 10 + ["bill"] * 2, [40] * 9 + [2000] + [7, 7], failed=["send", "send", "bill"])
    now_s = int(redis.time()[0])
    # make the snapshot the one at the start of the last hour (as if taken then)
    five = next(k for k in snaps if b"snap:5m:" in k)
    redis.rename(five, f"{keys.metrics}snap:5m:{(now_s - 3600) // 300}")
    w = history.window(redis, "h-q", "1h")
    assert w.since_ms is not None
    by_task = {t.task: t for t in w.tasks}
    assert (by_task["send"].runs, by_task["send"].failures) == (10, 2)
    assert by_task["send"].p50_ms == 50 and by_task["send"].p95_ms == 2500
    assert by_task["send"].mean_ms == pytest.approx((9 * 40 + 2000) / 10)
    assert (by_task["bill"].runs, by_task["bill"].failures, by_task["bill"].p95_ms) == (2, 1, 10)
    assert [t.task for t in w.tasks] == ["send", "bill"], "busiest first"
    assert len(w.failures) == 60
    redis.hincrby(f"{keys.minute_counters}{w.now_ms // 60_000}", "failed", 3)
    redis.hincrby(f"{keys.minute_counters}{w.now_ms // 60_000 - 59}", "failed", 2)
    again = history.window(redis, "h-q", "1h")
    if again.now_ms // 60_000 == w.now_ms // 60_000:  # the minute did not turn meanwhile
        assert again.failures[-1] == 3 and again.failures[0] == 2 and sum(again.failures) == 5


def test_without_a_snapshot_the_figures_are_all_time_and_say_so(redis):
    keys = QueueKeys.for_queue("h-none")
    _settle(redis, keys, ["send"] * 3, [3, 3, 3])
    w = history.window(redis, "h-none", "24h")
    assert w.since_ms is None and w.tasks[0].runs == 3
    assert len(w.failures) == 96


def test_seven_days_of_failures_per_hour_from_the_hourly_snapshots(redis):
    keys = QueueKeys.for_queue("h-week")
    hour = int(redis.time()[0]) // 3600
    for back, failed in ((3, 10), (2, 14), (1, 20), (0, 20)):
        redis.hset(f"{keys.metrics}snap:1h:{hour - back}", mapping={"_at": 1, "t:failed": failed})
    redis.hset(keys.totals, "failed", 21)
    w = history.window(redis, "h-week", "7d")
    assert len(w.failures) == 168
    assert w.failures[-4:] == [4, 6, 0, 1]  # hours -3, -2, -1, and the current one so far
    assert w.failures[0] is None, "no snapshot a week ago: unknown, not zero"


def test_an_unknown_range_is_refused_in_words(redis):
    with pytest.raises(ValueError, match="1h, 24h, 7d"):
        history.window(redis, "q", "2w")


def test_queues_combine_step_by_step_and_an_unknown_step_stays_unknown():
    rng = history.RANGES["7d"]
    a = history.Window("a", rng, 0, 10, [history.TaskFigures("t", 3, 1, 5.0, 5, 10)], [1, None, 2], 0)
    b = history.Window("b", rng, 0, 20, [history.TaskFigures("t", 7, 0, 5.0, 5, 10)], [4, 5, 6], 0)
    both = history.combined([a, b])
    assert both.failures == [5, None, 8]
    assert [(t.task, t.runs) for t in both.tasks] == [("b: t", 7), ("a: t", 3)]
    assert both.since_ms == 20
