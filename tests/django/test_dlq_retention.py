"""DLQ retention in the project's settings: checked by ``manage.py check``, published by runworker, shown."""

from __future__ import annotations

import io
import re

import pytest
from django.tasks import task_backends
from django.test import Client

from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.dlq import retention
from chasqui_core.engine.dlq.retention import Retention
from chasqui_core.management.commands.runworker import _publish_retention
from tests.helpers import bulk_dead

Q = "emails"


@pytest.mark.parametrize(
    ("chasqui", "words"),
    [
        ({"DLQ_MAX_ENTRIES": 0}, "settings.CHASQUI['DLQ_MAX_ENTRIES']: max_entries must be a whole number"),
        ({"DLQ_MAX_AGE_DAYS": "30"}, "settings.CHASQUI['DLQ_MAX_AGE_DAYS']: max_age_days must be a number of days"),
        ({"DLQ_RETENTION": {"emails": {"max_entries": -1}}}, "['DLQ_RETENTION']['emails']: max_entries must be"),
        ({"DLQ_RETENTION": {"emails": {"keep": 5}}}, "unknown key(s) 'keep'"),
        ({"DLQ_RETENTION": {"no spaces": {}}}, "Queue name 'no spaces' is not valid"),
        ({"DLQ_RETENTION": ["emails"]}, "must be a dict of rules by queue name"),
    ],
)
def test_a_bad_retention_setting_fails_the_check_in_words(settings, chasqui, words):
    settings.CHASQUI = chasqui
    [error] = task_backends["default"].check()
    assert error.id == "chasqui.E001" and words in error.msg


def test_a_queue_rule_overrides_the_defaults_key_by_key(settings):
    settings.CHASQUI = {
        "DLQ_MAX_ENTRIES": 10_000,
        "DLQ_MAX_AGE_DAYS": 90,
        "DLQ_RETENTION": {"emails": {"max_age_days": 7}, "audit": {"max_entries": None}},
    }
    conf = chasqui_settings()
    assert task_backends["default"].check() == []
    assert conf.dlq_retention("emails") == Retention(10_000, 7)
    assert conf.dlq_retention("audit") == Retention(None, 90)
    assert conf.dlq_retention("other") == Retention(10_000, 90)


def test_runworker_publishes_the_rules_of_its_queues(settings, redis, redis_url):
    settings.CHASQUI = {"REDIS_URL": redis_url, "DLQ_RETENTION": {Q: {"max_entries": 500}}}
    _publish_retention(chasqui_settings(), [Q, "other"], io.StringIO())
    assert retention.read(redis, Q) == Retention(500)
    assert retention.read(redis, "other") == Retention()


def test_the_dlq_page_shows_the_rule_and_warns_near_its_limit(settings, viewer, redis):
    settings.CHASQUI = {"DLQ_RETENTION": {Q: {"max_entries": 100}}}
    bulk_dead(redis, Q, 80)
    c = Client()
    c.force_login(viewer)
    calm = c.get(f"/queues/{Q}/dlq/").content.decode()
    assert "keeps at most 100 entries, the oldest trimmed first" in calm and "It holds" not in calm
    bulk_dead(redis, Q, 40)
    assert retention.trim(redis, Q, Retention(100)) == 20
    near = re.sub(r"\s+", " ", c.get(f"/queues/{Q}/dlq/").content.decode())
    assert "It holds <strong>100</strong> of at most 100" in near and "20 trimmed so far" in near
