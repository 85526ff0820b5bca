"""The traps a project adopting Chasqui fell into: each one is now reported in words, or gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.tasks import task_backends

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.models import OutboxEntry
from chasqui_core.outbox import relay

from tests.helpers import ROOT

from . import sample_tasks

DEFAULT = QueueKeys.for_queue("default")


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://:s3cret@127.0.0.1:{port}/0"  # nothing listens there once the socket closes


def _errors(check_id: str) -> list[checks.CheckMessage]:
    """What Chasqui's registered checks report under ``check_id`` (the database-touching checks of others left out)."""
    ours = [c for c in checks.registry.registry.get_checks() if c.__module__ == "chasqui_core.checks"]
    assert {c.__name__ for c in ours} >= {"redis_url", "runworker_command"}
    return [m for check in ours for m in check(app_configs=None) if m.id == check_id]


# --- REDIS_URL's scheme: one system check, one message ------------------------------------------------


@pytest.mark.parametrize("url, found", [
    ("http://127.0.0.1:6379/0", "its scheme is 'http://'"),
    ("redis//127.0.0.1:6379/0", "it has no scheme"),
    ("127.0.0.1:6379", "it has no scheme"),
])
def test_a_redis_url_with_a_scheme_no_client_uses_is_a_system_check_error(settings, url, found):
    settings.REDIS_URL = url
    [error] = _errors("chasqui.E003")
    assert error.level == checks.ERROR
    assert f"settings.REDIS_URL is {url!r}, and {found}" in error.msg
    for scheme in ("redis://", "rediss://", "unix://", "redis+sentinel://"):
        assert scheme in error.msg


def test_the_scheme_message_masks_the_password_and_names_chasqui_s_own_setting(settings):
    settings.CHASQUI = {"REDIS_URL": "https://user:hunter2@cache.internal:6379/0"}
    [error] = _errors("chasqui.E003")
    assert error.msg.startswith("settings.CHASQUI['REDIS_URL'] is ")
    assert "hunter2" not in error.msg


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///tmp/redis.sock",
                                 "redis+sentinel://127.0.0.1:26379/mymaster", "REDIS://127.0.0.1:6379/0"])
def test_accepted_schemes_pass_the_check(settings, url):
    settings.REDIS_URL = url
    assert _errors("chasqui.E003") == []


def test_an_enqueue_in_a_process_that_skipped_the_checks_says_the_same(settings):
    settings.REDIS_URL = "http://127.0.0.1:6379/0"
    with pytest.raises(ImproperlyConfigured, match=r"settings.REDIS_URL is 'http://127.0.0.1:6379/0'.*redis://"):
        sample_tasks.add.enqueue(1, 2)


@pytest.mark.parametrize("url, words", [
    ("redis://127.0.0.1:99999/0", "its port must be a number from 1 to 65535"),
    ("redis://127.0.0.1:port/0", "its port must be a number from 1 to 65535"),
    ("redis://127.0.0.1:6379/abc", "the database after the host must be a number of 0 or more"),
    ("redis://127.0.0.1:6379/-1", "the database after the host must be a number of 0 or more"),
    ("", "settings.REDIS_URL is empty"),
    ("   ", "settings.REDIS_URL is empty"),
])
def test_a_redis_url_no_server_could_answer_is_a_check_error_naming_the_setting(settings, url, words):
    settings.REDIS_URL = url
    [error] = _errors("chasqui.E003")
    assert error.msg.startswith("settings.REDIS_URL ") and words in error.msg


def test_an_empty_or_non_string_redis_url_anywhere_is_named_never_replaced_by_the_default(settings, monkeypatch):
    settings.CHASQUI = {"REDIS_URL": ""}
    [error] = _errors("chasqui.E003")
    assert error.msg.startswith("settings.CHASQUI['REDIS_URL'] is empty")
    settings.CHASQUI = {"REDIS_URL": 6379}
    [error] = _errors("chasqui.E003")
    assert error.msg.startswith("settings.CHASQUI['REDIS_URL'] must be a string")
    settings.CHASQUI = {}
    del settings.REDIS_URL
    monkeypatch.setenv("REDIS_URL", "")
    [error] = _errors("chasqui.E003")
    assert error.msg.startswith("the REDIS_URL environment variable is empty")
    with pytest.raises(ImproperlyConfigured, match="the REDIS_URL environment variable is empty"):
        sample_tasks.add.enqueue(1, 2)


@pytest.mark.parametrize("name, value, words", [
    ("API_KEY_FAILURE_LIMIT", "twenty", "settings.API_KEY_FAILURE_LIMIT must be a whole number of 1 or more"),
    ("API_KEY_FAILURE_WINDOW", 0, "settings.API_KEY_FAILURE_WINDOW must be a whole number of 1 or more"),
    ("CHASQUI_SAMPLER_INTERVAL", "1s", "settings.CHASQUI_SAMPLER_INTERVAL must be a number above 0"),
    ("LOGIN_URL", None, "settings.LOGIN_URL must be a path or a URL name"),
])
def test_a_setting_outside_chasqui_of_the_wrong_type_is_a_check_error_naming_it(settings, name, value, words):
    assert _errors("chasqui.E005") == []
    setattr(settings, name, value)
    [error] = _errors("chasqui.E005")
    assert words in error.msg


@pytest.mark.parametrize("env, words", [
    ({"REDIS_URL": "redis://127.0.0.1:99999/0"}, "(chasqui.E003) settings.REDIS_URL is 'redis://127.0.0.1:99999/0'"),
    ({"REDIS_URL": ""}, "(chasqui.E003) the REDIS_URL environment variable is empty"),
    ({"CHASQUI_TRUSTED_PROXIES": "proxy"}, "(chasqui.E001) settings.CHASQUI['TRUSTED_PROXIES'] holds 'proxy'"),
])
def test_manage_py_check_reports_bad_settings_in_words_without_a_traceback(tmp_path, env, words):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", **env}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0, done.stdout
    assert words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("(chasqui.E") == 1, done.stderr  # said once


# --- Channels' runworker ----------------------------------------------------------------------------------


def test_this_project_s_runworker_is_chasqui_s():
    assert _errors("chasqui.E004") == []


def test_channels_listed_first_stops_runworker_with_the_fix(tmp_path):
    """With channels above chasqui_core, Django would run Channels' worker: the check stops it, naming the fix."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.django.channels_first_settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "manage.py", "runworker", "emails"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout
    assert "chasqui.E004" in done.stderr
    assert "Move 'chasqui_core' above 'channels' in INSTALLED_APPS." in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 30  # stopped by the check, not by a Redis timeout


# --- OUTBOX with RESULT_TTL while Redis is down ---------------------------------------------------------------


@pytest.fixture
def outbox_with_results(settings, redis):
    settings.TASKS = {"default": {"BACKEND": "chasqui_core.backend.ChasquiBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"OUTBOX": True, "RESULT_TTL": 60}}}
    return task_backends["default"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_outbox_commit_with_redis_down_neither_raises_nor_stalls(outbox_with_results, redis, redis_url, settings):
    settings.CHASQUI = {"REDIS_URL": _closed_port_url()}  # default ENQUEUE_RETRY_SECONDS: 5
    started = time.monotonic()
    with transaction.atomic():  # the on-commit relay runs when this block ends: it must not raise
        result = sample_tasks.add.enqueue(2, 3)
    took = time.monotonic() - started
    assert took < 2.0, f"the commit waited {took:.1f}s for Redis although the outbox holds the job"
    [row] = OutboxEntry.objects.all()
    assert row.job_id == result.id and row.attempts == 1
    assert result.enqueued_at is not None  # the job is enqueued: in the outbox

    settings.CHASQUI = {"REDIS_URL": redis_url}  # Redis is back: a worker's relay sends the job
    assert relay(outbox_with_results.queue) == 1
    [(_, fields)] = redis.xrange(DEFAULT.stream)
    assert decode(fields[b"j"]).id == result.id


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_outbox_commit_with_redis_up_records_the_ready_result(outbox_with_results, redis):
    with transaction.atomic():
        result = sample_tasks.add.enqueue(2, 3)
    assert not OutboxEntry.objects.exists()
    assert outbox_with_results.get_result(result.id).status == "READY"
