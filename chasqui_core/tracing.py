"""OpenTelemetry spans for enqueues and runs, when opentelemetry-api is installed (``django-chasqui[otel]``).

The enqueue's span context travels in the job's envelope meta (``META_KEY``, the W3C ``traceparent`` /
``tracestate`` the configured propagator writes), so a run's span is a child of the span that enqueued it,
and so of the request that did, across processes and retries: every run of a job, its retries and replays
included, carries the same parent and is told apart by ``chasqui.attempt``. The first run also leaves its own
context in the meta (``FIRST_RUN_KEY``), which the envelope carries into its retries and, through the
dead-letter entry, its replays: each later run's span has a link to the first, so a tracing UI goes from a
retry straight to the run that started the trouble.

The import is tried once, here. Without the package, or with ``CHASQUI["OPENTELEMETRY"] = False``,
``enabled()`` is one global read and a settings attribute, and the callers take their untraced path: no
span, no context in the job. With the package but no SDK (no tracer provider installed, the API's
default), a span would record nothing, yet making one cost a fifth of a noop job's run in the worker; so
the untraced path is taken then too, unless there is a trace context to pass on (one the job carries, or a
current span's).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from chasqui_core.conf import chasqui_settings

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed
    _trace = None
    _tracer = None
else:
    # A proxy until the project installs its provider, then that provider's tracer: safe to make once.
    _tracer = _trace.get_tracer("chasqui")

META_KEY = "otel"
"""Where a job's envelope meta holds the enqueuer's trace context (a small dict of strings)."""

FIRST_RUN_KEY = "otel_first_run"
"""Where it holds the trace context of the job's first run, for the links of its retries and replays."""

QUEUE, TASK, JOB_ID, ATTEMPT, OUTCOME, COUNT = (
    "chasqui.queue", "chasqui.task", "chasqui.job_id", "chasqui.attempt", "chasqui.outcome", "chasqui.count")


_provider_set = False
"""Set once a tracer provider other than the API's default is seen (one cannot be taken back)."""


def enabled(meta: Mapping[str, Any] | None = None) -> bool:
    """Whether spans are made: the package is installed, the setting leaves them on, and a span would record
    something or pass a context on (``meta``: a run's job meta, which may carry its enqueuer's context)."""
    if _trace is None or not chasqui_settings().OPENTELEMETRY:
        return False
    if _provider_set or _recording():
        return True
    if meta is not None and META_KEY in meta:
        return True
    return bool(_trace.get_current_span().get_span_context().is_valid)


def enabled_for_run(meta: Mapping[str, Any]) -> bool:
    """``enabled`` for a run in a worker, whose span is the child of the context its job carries (``meta``), never
    of a span current in the worker: the current span is not looked at (asking for it cost a noop task's run in
    the worker half a microsecond, a twentieth of the run)."""
    if _trace is None or not chasqui_settings().OPENTELEMETRY:
        return False
    return _provider_set or META_KEY in meta or _recording()


_none_until = 0.0
"""Until this monotonic time, no provider is taken as installed without asking (the API reads the environment
for one each time it is asked, which cost more than the rest of an untraced run's checks)."""

PROVIDER_RECHECK_S = 1.0
"""How long "no provider" is believed: a provider installed later is used within this many seconds."""


def _recording() -> bool:
    """Whether spans go somewhere: a provider is installed, or the tracer was given one directly."""
    global _provider_set, _none_until
    assert _trace is not None
    if not isinstance(_tracer, _trace.ProxyTracer):
        return True
    now = time.monotonic()
    if now < _none_until:
        return False
    if isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        _none_until = now + PROVIDER_RECHECK_S
        return False
    _provider_set = True
    return True


@contextmanager
def enqueue_span(queue: str, task: str, count: int = 1) -> Iterator[tuple[Any, dict[str, str]]]:
    """A producer span around one enqueue (or one batch), and the carrier to put in each job's meta."""
    assert _trace is not None and _tracer is not None
    with _tracer.start_as_current_span(f"chasqui enqueue {task}", kind=_trace.SpanKind.PRODUCER) as span:
        if span.is_recording():
            span.set_attribute(QUEUE, queue)
            span.set_attribute(TASK, task)
            if count > 1:
                span.set_attribute(COUNT, count)
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:  # else no SDK is installed: nothing to carry
            _propagate.inject(carrier)
        yield span, carrier


def with_carrier(meta: Mapping[str, Any], carrier: dict[str, str]) -> dict[str, Any]:
    """``meta`` with the trace context added (a copy: the task's shared options are left alone)."""
    return {**meta, META_KEY: carrier} if carrier else dict(meta)


def enqueued(span: Any, job_ids: list[str]) -> None:
    """Name the job on the enqueue's span once its id is known (a batch's span names its first)."""
    if job_ids and span.is_recording():
        span.set_attribute(JOB_ID, job_ids[0])


@contextmanager
def run_span(queue: str, task: str, job_id: str, attempt: int, meta: dict[str, Any]) -> Iterator[Any]:
    """A consumer span around one run, the child of the enqueue whose context the job carries, and linked to
    the job's first run when this is a later one (a retry or a replay).

    ``meta`` is the job's own, written back with the job when it is retried or dead-lettered: the first run
    records its context there.
    """
    assert _trace is not None and _tracer is not None
    carrier = meta.get(META_KEY)
    parent = _propagate.extract(carrier) if isinstance(carrier, Mapping) else None
    first = meta.get(FIRST_RUN_KEY)
    links = _link_to(first) if isinstance(first, Mapping) else None
    with _tracer.start_as_current_span(
        f"chasqui run {task}", context=parent, kind=_trace.SpanKind.CONSUMER,
        attributes={QUEUE: queue, TASK: task, JOB_ID: job_id, ATTEMPT: attempt}, links=links,
        record_exception=False, set_status_on_exception=False,
    ) as span:
        if first is None and span.get_span_context().is_valid:
            own: dict[str, str] = {}
            _propagate.inject(own, context=_trace.set_span_in_context(span))
            if own:
                meta[FIRST_RUN_KEY] = own
        yield span


def _link_to(carrier: Mapping[str, Any]) -> list[Any] | None:
    """A link to the run whose context ``carrier`` holds, or none when it cannot be read back."""
    assert _trace is not None
    context = _trace.get_current_span(_propagate.extract(carrier)).get_span_context()
    return [_trace.Link(context)] if context.is_valid else None


def ended(span: Any, outcome: str, exc: BaseException | None = None) -> None:
    """Record how the run ended: ``succeeded``, ``retrying``, ``failed`` (for good) or ``cancelled``."""
    if not span.is_recording():
        return
    span.set_attribute(OUTCOME, outcome)
    if exc is not None:
        span.record_exception(exc)
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
