"""What a producer hands a queue, and what it gets back: ``JobSpec`` (one job and its options), ``template``
(its options checked once: a ``JobTemplate`` that builds jobs), ``build`` (a spec validated and encoded, a
``BuiltJob`` ready to send now or on commit) and ``Enqueued`` (what became of it).

Kept apart from the sending (queue.py) because the Django backend and the
outbox validate jobs long before they are sent, and because validation is
where a caller's mistake becomes an error in words (a ``ValueError`` naming
the option), while the sending only deals with Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from chasqui_core.engine.jobs import job_ids
from chasqui_core.engine.jobs.backoff import BackoffSpec, coerce_backoff
from chasqui_core.engine.jobs.envelope import MAX_RESULT_TTL, check_json_types, new_job_id, now_ms, pack_job
from chasqui_core.engine.jobs.idempotency import IDEMPOTENCY_KEY, IDEMPOTENCY_TTL, check_key, check_ttl
from chasqui_core.engine.jobs.priority import PRIORITY_META, band_of, check_priority
from chasqui_core.engine.jobs.registry import TIMEOUT_META, check_timeout
from chasqui_core.engine.jobs.signing import SIGNATURE, Signer
from chasqui_core.engine.worker.limits import LIMIT_KEY_META

_RESERVED_META = frozenset({SIGNATURE, IDEMPOTENCY_KEY, IDEMPOTENCY_TTL, TIMEOUT_META, LIMIT_KEY_META, PRIORITY_META})


_FLAT = frozenset({str, int, bool, type(None)})
"""Argument types ``check_json_types`` always accepts (floats are checked: they may be infinite or NaN)."""


class PayloadTooLarge(ValueError):
    """An encoded job is bigger than the queue accepts."""


@dataclass(slots=True)
class JobSpec:
    """One job for ``add_bulk``; the same options as ``Queue.add``."""

    task: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    delay: timedelta | int | float | None = None
    run_at: datetime | None = None
    attempts: int | None = None
    backoff: BackoffSpec | int | dict[str, Any] | str | None = None
    result_ttl: int = 0
    meta: Mapping[str, Any] | None = None
    idempotency_key: str | bool | None = None
    """Guards execution: a job whose key already completed (within its TTL) is acknowledged, not run.
    True uses the job's id. See idempotency.py."""
    idempotency_ttl: int | None = None
    """Seconds the completed key is remembered; None: the queue's ``idempotency_ttl``."""
    timeout: float | None = None
    """Seconds a run of this job may take, over its task's and the worker's timeout; None: theirs."""
    limit_key: str | None = None
    """The bucket this job takes in its keyed rate and concurrency limits, over the value of their ``key``
    argument (see limits.py)."""
    priority: int = 0
    """-100 to 100, higher first: above 0 the queue's high band, below 0 its low band (priority.py)."""


class Enqueued(NamedTuple):
    """What became of one added job (a named tuple: bulk adds make one per job)."""

    job_id: str
    queue: str
    entry_id: str | None
    """Stream entry id when the job is ready now; None when delayed or a duplicate."""
    delayed: bool = False
    duplicate: bool = False
    """True when a job with the same caller-given id was added within the idempotency window."""


class BuiltJob(NamedTuple):
    """A job validated and encoded by ``Queue.build``, ready to send (now, or on commit)."""

    idempotency_key: str
    """The caller-given job id ("" when the queue chose one): repeats within the window add nothing."""
    when: str
    """Empty to run now; else ``+<delay ms>``, or ``@<epoch ms>`` for a due time."""
    payload: bytes
    job_id: str


def _when(delay: timedelta | int | float | None, run_at: datetime | None) -> str:
    if delay is not None and run_at is not None:
        raise ValueError("Give either delay= or run_at=, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise TypeError(f"run_at must be a datetime, not {type(run_at).__name__}")
        if run_at.tzinfo is None:
            raise ValueError("run_at must be a timezone-aware datetime")
        return "@" + str(int(run_at.timestamp() * 1000))
    if delay is None:
        return ""
    if isinstance(delay, timedelta):
        ms = delay.total_seconds() * 1000
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        ms = float(delay)
    else:
        raise TypeError(f"delay must be a timedelta or a number of milliseconds, not {type(delay).__name__}")
    if ms != ms or ms < 0:
        raise ValueError(f"delay must be 0 or more, got {delay!r}")
    return "+" + str(int(ms)) if ms > 0 else ""



@dataclass(frozen=True, slots=True)
class JobTemplate:
    """What every job built from one spec shares, checked and encoded once; ``build(args, kwargs)`` then does
    only each job's own part: its arguments checked, its id and time, its signature, the packing.

    The Django backend keeps one per task (a task's options do not change between its enqueues) and
    ``Queue.add`` one for a job without options, so a caller's mistake in the options still raises in words,
    once, and a call pays only for its arguments.
    """

    task: str
    when: str
    job_id: str | None
    attempts: int | None
    backoff: dict[str, Any] | None
    result_ttl: int
    meta: dict[str, Any]
    """The meta every job carries (never changed: a job that adds to it gets a copy)."""
    key: str | None
    """The idempotency key every job carries; None: none, or each job's own id (``key_is_id``)."""
    key_is_id: bool
    key_ttl: int
    signer: Signer | None
    max_payload_bytes: int

    def build(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> BuiltJob:
        """One job of this template with these arguments, validated and encoded (see ``build``)."""
        args = list(args)
        kwargs = kwargs if type(kwargs) is dict else dict(kwargs)
        if not _FLAT.issuperset(map(type, args)):  # flat arguments (the usual) need no walk
            check_json_types(args, "args")
        if kwargs and not _FLAT.issuperset(map(type, kwargs.values())):
            check_json_types(kwargs, "kwargs")
        job_id = self.job_id
        jid = job_id or new_job_id()
        task, meta, key, signer = self.task, self.meta, self.key, self.signer
        if self.key_is_id:
            meta = {**meta, IDEMPOTENCY_KEY: jid, IDEMPOTENCY_TTL: self.key_ttl}
            key = jid
        created = now_ms()
        if signer is not None:
            meta = {**meta, SIGNATURE: signer.sign(jid, task, args, kwargs, created, key)}
        payload = pack_job(jid, task, args, kwargs, created, self.attempts, self.backoff, self.result_ttl, meta)
        if len(payload) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"Job for task {task!r} is {len(payload)} bytes once encoded; "
                f"the queue accepts at most {self.max_payload_bytes} bytes. "
                "Pass a reference (a row id, a file path) instead of the data."
            )
        return BuiltJob(job_id or "", self.when, payload, jid)


def template(spec: JobSpec, *, signer: Signer | None, idempotency_ttl: int, max_payload_bytes: int) -> JobTemplate:
    """Check a spec's options (all but its arguments) in words and encode what its jobs share: signed with
    ``signer`` when given, an idempotency key remembered for ``idempotency_ttl`` seconds unless the spec says
    otherwise, at most ``max_payload_bytes`` once encoded."""
    task = spec.task
    if type(task) is not str or not task:
        raise ValueError("A job needs a task name (a non-empty string)")
    attempts = spec.attempts
    if attempts is not None and (type(attempts) is not int or attempts < 1):
        raise ValueError(f"attempts must be a whole number of 1 or more, got {attempts!r}")
    backoff = spec.backoff
    if backoff is not None:
        backoff = coerce_backoff(backoff).to_dict()  # type: ignore[union-attr]
    job_id = spec.job_id
    if job_id is not None:
        job_ids.check(job_id)
    when = "" if spec.delay is None and spec.run_at is None else _when(spec.delay, spec.run_at)
    result_ttl = spec.result_ttl
    if type(result_ttl) is not int or not 0 <= result_ttl <= MAX_RESULT_TTL:
        raise ValueError(f"result_ttl must be a whole number of seconds from 0 to {MAX_RESULT_TTL}, "
                         f"got {result_ttl!r}")
    meta = dict(spec.meta) if spec.meta else {}
    if meta:
        check_json_types(meta, "meta")
        if not _RESERVED_META.isdisjoint(meta):
            raise ValueError(f"meta keys {', '.join(sorted(_RESERVED_META))} are the queue's own; "
                             "pass idempotency_key=, idempotency_ttl=, timeout=, limit_key= and priority= instead")
    key = spec.idempotency_key
    ttl = spec.idempotency_ttl
    key_is_id = key is True
    if key is None or key is False:
        if ttl is not None:
            raise ValueError("idempotency_ttl is only meaningful with an idempotency_key")
        key, key_ttl = None, idempotency_ttl
    else:
        key_ttl = idempotency_ttl if ttl is None else check_ttl(ttl)
        if key_is_id:  # each job's own id: set per job
            key = None
        else:
            key = meta[IDEMPOTENCY_KEY] = check_key(key)
            meta[IDEMPOTENCY_TTL] = key_ttl
    if spec.timeout is not None:
        meta[TIMEOUT_META] = check_timeout(spec.timeout)
    if spec.limit_key is not None:
        if type(spec.limit_key) is not str or not 0 < len(spec.limit_key) <= 200:
            raise ValueError(f"limit_key must be a non-empty string of at most 200 characters, "
                             f"got {spec.limit_key!r}")
        meta[LIMIT_KEY_META] = spec.limit_key
    if spec.priority or type(spec.priority) is not int:
        band = band_of(check_priority(spec.priority))
        meta[PRIORITY_META] = spec.priority
        if not when:  # ready now: straight to the band's stream (delayed, the promoter reads the envelope)
            when = "!" + band
    return JobTemplate(task, when, job_id, attempts, backoff, result_ttl, meta, key, key_is_id, key_ttl, signer,
                       max_payload_bytes)


def has_options(spec: JobSpec) -> bool:
    """Whether a spec sets anything but its task and arguments (most do not: their jobs share a template)."""
    return not (spec.job_id is None and spec.delay is None and spec.run_at is None and spec.attempts is None
                and spec.backoff is None and spec.result_ttl == 0 and not spec.meta and spec.idempotency_key is None
                and spec.idempotency_ttl is None and spec.timeout is None and spec.limit_key is None
                and spec.priority == 0 and type(spec.priority) is int and type(spec.result_ttl) is int)


def build(spec: JobSpec, *, signer: Signer | None, idempotency_ttl: int, max_payload_bytes: int) -> BuiltJob:
    """Validate and encode one job: ``template`` of its options, built with its arguments."""
    return template(spec, signer=signer, idempotency_ttl=idempotency_ttl,
                    max_payload_bytes=max_payload_bytes).build(spec.args, spec.kwargs)
