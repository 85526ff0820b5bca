"""Schedules: definitions checked in words, due times computed alike everywhere, misfire policies."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from chasqui_core.engine.timing.schedules import ScheduleError, parse_schedule, plan_fires


def every(seconds, **extra):
    return parse_schedule("tick", {"task": "app.tasks.tick", "every": seconds, "queue": "q", **extra})


def cron(expr, zone="UTC", **extra):
    return parse_schedule("nightly", {"task": "app.tasks.nightly", "cron": expr, "timezone": zone, "queue": "q",
                                      **extra})


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


@pytest.mark.parametrize("raw, words", [
    ({"task": "a.b"}, "needs exactly one of 'cron'"),
    ({"task": "a.b", "cron": "0 3 * * *", "every": 60}, "not both"),
    ({"task": "a.b", "cron": "61 * * * *"}, "not a 5-field cron expression"),
    ({"task": "a.b", "cron": "0 3 * *"}, "not a 5-field cron expression"),
    ({"task": "a.b", "every": 0.5}, "'every'] must be a number of seconds of 1 or more"),
    ({"task": "a.b", "every": "60"}, "'every'] must be a number of seconds"),
    ({"task": "a.b", "every": 5, "timezone": "America/Lima"}, "only applies to 'cron'"),
    ({"task": "a.b", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "not a time zone name"),
    ({"task": "a.b", "every": 5, "misfire": "sometimes"}, "'misfire'] must be one of skip, run_once, run_all"),
    ({"task": "a.b", "every": 5, "attempts": 0}, "'attempts'] must be a whole number of 1 or more"),
    ({"task": "a.b", "every": 5, "backoff": "sideways"}, "'backoff'] is not valid"),
    ({"task": "a.b", "every": 5, "args": "x"}, "'args'] must be a list"),
    ({"task": "a.b", "every": 5, "args": [b"raw"]}, "JSON-serializable"),
    ({"task": "a.b", "every": 5, "colour": "red"}, "unknown key(s) colour"),
    ({"task": "", "every": 5}, "'task'] must be the dotted path of a task"),
    ({"task": "a.b", "every": 5, "queue": "no spaces"}, "'queue']"),
])
def test_a_bad_definition_is_refused_naming_the_schedule_and_the_key(raw, words):
    with pytest.raises(ScheduleError) as caught:
        parse_schedule("report", {"queue": "q", **raw})
    assert "SCHEDULES['report']" in str(caught.value)
    assert words in str(caught.value)


def test_a_bad_name_and_a_missing_queue_are_refused():
    with pytest.raises(ScheduleError, match="schedule name 'two words' is not valid"):
        parse_schedule("two words", {"task": "a.b", "every": 5, "queue": "q"})
    with pytest.raises(ScheduleError, match="is not valid"):
        parse_schedule("report\n", {"task": "a.b", "every": 5, "queue": "q"})
    with pytest.raises(ScheduleError, match="needs a 'queue'"):
        parse_schedule("report", {"task": "a.b", "every": 5})
    assert parse_schedule("report", {"task": "a.b", "every": 5}, default_queue="emails").queue == "emails"


def test_every_fires_at_whole_multiples_of_its_period_whoever_computes_it():
    s = every(5)
    assert s.next_after(12_001) == 15_000
    assert s.next_after(15_000) == 20_000  # strictly after
    assert s.job_id(15_000) == "schedule:tick:15000"
    assert every(2.5).next_after(4_999) == 5_000


def test_cron_follows_its_time_zone_across_a_daylight_saving_change():
    s = cron("30 2 * * *", "America/New_York")
    lima = cron("0 3 * * *", "America/Lima")
    # 2026-03-08: New York skips 02:00-03:00, so 02:30 does not exist that night
    start = ms(datetime(2026, 3, 7, 12, 0, tzinfo=ZoneInfo("America/New_York")))
    first = s.next_after(start)
    second = s.next_after(first)
    assert datetime.fromtimestamp(first / 1000, ZoneInfo("America/New_York")).hour in (2, 3)
    assert datetime.fromtimestamp(second / 1000, ZoneInfo("America/New_York")) == datetime(
        2026, 3, 9, 2, 30, tzinfo=ZoneInfo("America/New_York"))
    due = lima.next_after(ms(datetime(2026, 6, 1, 12, 0, tzinfo=UTC)))
    assert datetime.fromtimestamp(due / 1000, UTC) == datetime(2026, 6, 2, 8, 0, tzinfo=UTC)  # 03:00 at UTC-5
    assert lima.latest_at_or_before(due) == due
    assert lima.latest_at_or_before(due - 1) == due - 24 * 3600 * 1000


def test_a_long_outage_is_counted_without_walking_every_due_time():
    s = every(1)
    year = 365 * 24 * 3600 * 1000
    due, following, total = s.due_between(1_000, 1_000 + year, 3)
    assert total == year // 1000 + 1
    assert due == [year - 1000, year, year + 1000] and following == year + 2000
    minutely = cron("* * * * *")
    start = minutely.next_after(0)
    due, following, total = minutely.due_between(start, start + 30 * 24 * 3600 * 1000, 2)
    assert total >= 10_000 and len(due) == 2 and due[-1] == start + 30 * 24 * 3600 * 1000
    assert following == due[-1] + 60_000


def test_misfire_policies_decide_what_runs_after_a_stopped_period():
    # due every second from 10 s; the scheduler comes back at 20.3 s: eleven due times, 20 s is 300 ms old
    now = 20_300

    def plan(**extra):
        return plan_fires(every(1, **extra), 10_000, now)

    # within a grace of 2 s, 19 s and 20 s are late but on time: they run whatever the policy
    assert plan(misfire="skip", grace=2) == ([19_000, 20_000], 21_000, 9)
    assert plan(misfire="run_once", grace=2) == ([19_000, 20_000], 21_000, 9)
    assert plan(misfire="run_all", grace=2) == ([10_000 + i * 1000 for i in range(11)], 21_000, 0)
    assert plan(misfire="run_all", grace=2, catch_up=3) == ([18_000, 19_000, 20_000], 21_000, 8)
    # with the default grace of a minute, a ten-second gap (a leader failover, say) is caught up on
    assert plan(misfire="skip") == ([10_000 + i * 1000 for i in range(11)], 21_000, 0)
    # with no grace, every due time is missed: skip runs nothing, run_once runs one for all of them
    assert plan(misfire="skip", grace=0) == ([], 21_000, 11)
    assert plan(misfire="run_once", grace=0) == ([20_000], 21_000, 10)
    assert plan(misfire="run_all", grace=0, catch_up=2) == ([19_000, 20_000], 21_000, 9)
    # nothing due yet
    assert plan_fires(every(1), 21_000, now) == ([], 21_000, 0)


def test_the_version_changes_with_the_timing_only():
    assert every(5).version == every(5, args=[1], attempts=2).version
    assert every(5).version != every(6).version
    assert cron("0 3 * * *").version != cron("0 3 * * *", "America/Lima").version
