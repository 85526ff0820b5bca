"""A DLQ's retention rule: the oldest entries trimmed with the index, counted, and run by the workers."""

import pytest

from chasqui_core.engine.dlq import retention
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.index import DLQIndex
from chasqui_core.engine.dlq.replay import DeadLetters
from chasqui_core.engine.dlq.retention import Retention
from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.jobs.registry import HandlerRegistry
from tests.engine.dlq_entries import KEYS, Q, bulk_dead, dead_job, fields_for
from tests.engine.test_dlq import run_worker
from tests.engine.test_dlq_index import assert_index_matches


def test_a_count_keeps_the_newest_entries_and_the_index_follows(redis):
    old, _ = bulk_dead(redis, 2500, task="reports.build")
    new, _ = bulk_dead(redis, 1500)
    assert DLQIndex(redis, Q).rebuild().ready
    assert retention.trim(redis, Q, Retention(max_entries=2000)) == 2000
    dl = DeadLetters(redis, Q)
    assert [d.entry_id for d in dl.page(limit=3000).items] == (old[2000:] + new)[::-1]
    assert dl.count_matching(DLQFilter(task="reports.build")) == 500  # the index counts what is left
    assert DLQIndex(redis, Q).state().ready
    assert_index_matches(redis)
    assert retention.trimmed(redis, Q) == 2000
    assert retention.trim(redis, Q, Retention(max_entries=2000)) == 0  # nothing over the count: nothing goes


def test_an_age_trims_what_died_before_it(redis):
    day = retention.DAY_MS
    pipe = redis.pipeline(transaction=False)
    for i in range(30):
        pipe.xadd(KEYS.dlq, fields_for(dead_job()), id=f"{now_ms() - 10 * day + i}-0")  # ten days old
    pipe.execute()
    recent, _ = bulk_dead(redis, 20)
    assert DLQIndex(redis, Q).rebuild().ready
    assert retention.trim(redis, Q, Retention(max_age_days=7)) == 30
    assert [d.entry_id for d in DeadLetters(redis, Q).page(limit=100).items] == recent[::-1]
    assert_index_matches(redis)


def test_keeping_everything_trims_nothing(redis):
    bulk_dead(redis, 50)
    assert retention.trim(redis, Q, Retention()) == 0
    assert redis.xlen(KEYS.dlq) == 50 and retention.trimmed(redis, Q) == 0


def test_rules_are_published_for_every_worker_and_read_back(redis):
    retention.publish(redis, {Q: Retention(max_entries=10, max_age_days=1.5), "other": Retention()})
    assert retention.read(redis, Q) == Retention(10, 1.5)
    assert retention.read(redis, "other") == Retention()
    retention.publish(redis, {Q: Retention()})  # a rule taken out of the settings goes from Redis too
    assert retention.read(redis, Q) == Retention()


def test_a_worker_trims_its_queues_to_their_rule(redis, redis_url):
    bulk_dead(redis, 300)
    retention.publish(redis, {Q: Retention(max_entries=100)})
    run_worker(redis_url, HandlerRegistry(), lambda: redis.xlen(KEYS.dlq) == 100)
    assert retention.trimmed(redis, Q) == 200


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"max_entries": 0}, "max_entries must be a whole number of entries above 0"),
        ({"max_entries": 2.5}, "max_entries must be a whole number"),
        ({"max_age_days": -1}, "max_age_days must be a number of days above 0"),
        ({"max_age_days": "30"}, "max_age_days must be a number of days"),
        ({"keep": 5}, "unknown key(s) 'keep'"),
        ([10], "must be a dict"),
    ],
)
def test_bad_rules_are_refused_in_words(rule, message):
    with pytest.raises(ValueError, match=None) as caught:
        Retention.from_dict(rule, "settings.CHASQUI['DLQ_RETENTION']['emails']")
    assert message in str(caught.value) and "DLQ_RETENTION" in str(caught.value)


@pytest.mark.parametrize(("most", "left"), [(35, 30), (20, 20)])
def test_a_count_and_an_age_together_keep_what_both_allow(redis, most, left):
    day = retention.DAY_MS
    pipe = redis.pipeline(transaction=False)
    for i in range(10):
        pipe.xadd(KEYS.dlq, fields_for(dead_job()), id=f"{now_ms() - 10 * day + i}-0")  # ten days old
    pipe.execute()
    recent, _ = bulk_dead(redis, 30)
    assert DLQIndex(redis, Q).rebuild().ready
    assert retention.trim(redis, Q, Retention(max_entries=most, max_age_days=7)) == 40 - left
    assert [d.entry_id for d in DeadLetters(redis, Q).page(limit=100).items] == recent[::-1][:left]
    assert_index_matches(redis)
