"""OpenTelemetry: a span for each enqueue and each run, a run the child of the request that enqueued it.

Spans are caught with the SDK's in-memory exporter; the worker is a real one on a real Valkey.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chasqui_core import tracing
from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.store.keys import QueueKeys

from . import sample_tasks
from .test_backend import _drain

DEFAULT = QueueKeys.for_queue("default")
EXPORTER = InMemorySpanExporter()


@pytest.fixture(autouse=True)
def tracer(monkeypatch):
    """An SDK provider for this test only: the process's global provider is left alone, so no other test
    sees spans or trace context in its jobs."""
    global EXPORTER
    EXPORTER = InMemorySpanExporter()  # a provider's shutdown stops its exporter for good
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("chasqui"))
    yield provider.get_tracer("test")
    provider.shutdown()


@pytest.fixture(autouse=True)
def _clean(fresh_backend):
    sample_tasks.RUNS.clear()


def _spans(prefix: str) -> list:
    return [s for s in EXPORTER.get_finished_spans() if s.name.startswith(prefix)]


def _queued_meta(redis) -> dict:
    [(_, fields)] = redis.xrange(DEFAULT.stream)
    return decode(fields[b"job"] if b"job" in fields else next(iter(fields.values()))).meta


def test_a_run_is_the_child_of_the_enqueue_and_of_the_request_that_made_it(redis, redis_url, tracer):
    with tracer.start_as_current_span("POST /signup") as request_span:
        result = sample_tasks.add.enqueue(1, 2)
    assert tracing.META_KEY in _queued_meta(redis)  # the context travels in the job itself
    _drain(redis_url, until=lambda: len(_spans("chasqui run")) == 1)

    [enqueue] = _spans("chasqui enqueue")
    [run] = _spans("chasqui run")
    assert enqueue.parent.span_id == request_span.get_span_context().span_id
    assert enqueue.kind is trace.SpanKind.PRODUCER
    assert dict(enqueue.attributes) == {"chasqui.queue": "default", "chasqui.task": "tests.django.sample_tasks.add",
                                        "chasqui.job_id": result.id}
    assert run.context.trace_id == request_span.get_span_context().trace_id
    assert run.parent.span_id == enqueue.context.span_id
    assert run.kind is trace.SpanKind.CONSUMER
    assert dict(run.attributes) == {"chasqui.queue": "default", "chasqui.task": "tests.django.sample_tasks.add",
                                    "chasqui.job_id": result.id, "chasqui.attempt": 1,
                                    "chasqui.outcome": "succeeded"}
    assert run.status.is_ok


def test_every_run_of_a_retried_job_has_its_attempt_and_outcome_under_the_one_enqueue(redis, redis_url):
    result = sample_tasks.always_fails.enqueue("k")
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and len(_spans("chasqui run")) == 3)
    [enqueue] = _spans("chasqui enqueue")
    runs = sorted(_spans("chasqui run"), key=lambda s: s.attributes["chasqui.attempt"])
    assert [(s.attributes["chasqui.attempt"], s.attributes["chasqui.outcome"]) for s in runs] == [
        (1, "retrying"), (2, "retrying"), (3, "failed")]
    assert {s.parent.span_id for s in runs} == {enqueue.context.span_id}
    assert {s.attributes["chasqui.job_id"] for s in runs} == {result.id}
    assert all(s.status.status_code is trace.StatusCode.ERROR for s in runs)
    assert [e.attributes["exception.type"] for s in runs for e in s.events] == ["ValueError"] * 3
    first = runs[0].context
    assert not runs[0].links, "the first run links to nothing"
    assert [[(link.context.trace_id, link.context.span_id) for link in s.links] for s in runs[1:]] == [
        [(first.trace_id, first.span_id)]] * 2, "each retry links to the first run"


def test_an_async_task_is_traced_too(redis, redis_url):
    sample_tasks.async_double.enqueue(4)
    _drain(redis_url, until=lambda: len(_spans("chasqui run")) == 1)
    [run] = _spans("chasqui run")
    [enqueue] = _spans("chasqui enqueue")
    assert run.parent.span_id == enqueue.context.span_id
    assert run.attributes["chasqui.outcome"] == "succeeded"


def test_a_batch_has_one_enqueue_span_every_run_is_a_child_of(redis, redis_url):
    results = sample_tasks.add.enqueue_many([((i, i), {}) for i in range(3)])
    _drain(redis_url, until=lambda: len(_spans("chasqui run")) == 3)
    [enqueue] = _spans("chasqui enqueue")
    assert enqueue.attributes["chasqui.count"] == 3
    assert enqueue.attributes["chasqui.job_id"] == results[0].id
    assert {s.parent.span_id for s in _spans("chasqui run")} == {enqueue.context.span_id}


def test_off_by_the_setting_no_span_and_no_context_in_the_job(redis, redis_url, settings):
    settings.CHASQUI = {**getattr(settings, "CHASQUI", {}), "OPENTELEMETRY": False}
    assert not tracing.enabled()
    sample_tasks.add.enqueue(1, 2)
    assert tracing.META_KEY not in _queued_meta(redis)
    _drain(redis_url, until=lambda: sample_tasks.RUNS == [("add", 1, 2)])
    assert EXPORTER.get_finished_spans() == ()


def test_a_setting_that_is_not_true_or_false_is_refused_in_words():
    from django.core.exceptions import ImproperlyConfigured

    from chasqui_core.conf import load

    with pytest.raises(ImproperlyConfigured, match=r"OPENTELEMETRY'\] must be True or False, got 'yes'"):
        load({"OPENTELEMETRY": "yes"})


def test_without_the_package_nothing_is_traced_and_enqueue_works():
    """opentelemetry made unimportable: the backend imports, tracing is off, and no module of it is loaded."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import django\n"
        "django.setup()\n"
        "from chasqui_core import tracing, backend, task_runner\n"
        "assert not tracing.enabled()\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "print('ok')\n"
    )
    import os

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.django_db
def test_a_replayed_job_runs_under_the_enqueue_that_made_it(redis, redis_url):
    from chasqui_core.services import dlq as dlq_service

    sample_tasks.gives_up.enqueue()
    _drain(redis_url, until=lambda: redis.xlen(DEFAULT.dlq) == 1 and len(_spans("chasqui run")) == 1)
    [(entry_id, _)] = redis.xrange(DEFAULT.dlq)
    assert dlq_service.replay(None, "default", ids=[entry_id.decode()], source="cli") == 1
    _drain(redis_url, until=lambda: len(_spans("chasqui run")) == 2)
    [enqueue] = _spans("chasqui enqueue")
    runs = _spans("chasqui run")
    assert [s.attributes["chasqui.outcome"] for s in runs] == ["failed", "failed"]
    assert {s.parent.span_id for s in runs} == {enqueue.context.span_id}
    first, replayed = runs
    assert [(link.context.span_id, link.context.trace_id) for link in replayed.links] == [
        (first.context.span_id, first.context.trace_id)], "the replay's run links to the job's first run"


def test_without_a_tracer_provider_runs_make_no_span_until_the_project_installs_one():
    """The API package alone records nothing: until a provider is installed, enqueues and runs skip the span
    machinery (a no-op span per run would still cost a context switch); once one is, they are traced (within
    PROVIDER_RECHECK_S)."""
    code = (
        "import django\n"
        "django.setup()\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from chasqui_core import tracing\n"
        "before = tracing.enabled()\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "import time\n"
        "time.sleep(tracing.PROVIDER_RECHECK_S + 0.2)  # how long 'no provider' is believed\n"
        "print(before, tracing.enabled())\n"
    )
    import os

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
