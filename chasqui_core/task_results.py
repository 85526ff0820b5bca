"""Django's ``TaskResult`` built from what the engine stores, at the price of its fields.

An enqueue returns a READY TaskResult and a result lookup rebuilds one from the
engine's record; both happen on hot paths, so the arguments (already in JSON
form) skip TaskResult's own normalising constructor. Also here: the engine's
error records and timestamps in Django's terms, and how a cancelled job reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from datetime import datetime, UTC
from types import MemberDescriptorType
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.utils.json import normalize_json

from chasqui_core.engine.settle.outcomes import CANCELLED_CLASS

_READY_FIELDS = ("task", "id", "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at", "args",
                 "kwargs", "backend", "errors", "worker_ids")
_FLAT = frozenset({str, int, float, bool, type(None)})


def ready_result(task: Task, job_id: str, args, kwargs, backend: str) -> TaskResult:
    """The READY TaskResult an enqueue returns.

    The arguments have passed ``check_json_types`` already, so flat ones (the
    usual case) are copied as they are and only nested ones go through
    Django's ``normalize_json`` (which turns tuples into lists).
    """
    args = list(args)
    kwargs = dict(kwargs)
    if not _FLAT.issuperset(map(type, args)) or (kwargs and not _FLAT.issuperset(map(type, kwargs.values()))):
        args, kwargs = normalize_json(args), normalize_json(kwargs)
    return task_result(task, job_id, TaskResultStatus.READY, args, kwargs, backend)


def task_result(task: Task, job_id: str, status: TaskResultStatus, args: list, kwargs: dict, backend: str, *,
                enqueued_at: datetime | None = None, started_at: datetime | None = None,
                last_attempted_at: datetime | None = None, errors: list[TaskError] | None = None,
                worker_ids: list[str] | None = None) -> TaskResult:
    """A TaskResult built for the price of its fields, from arguments already in JSON form.

    TaskResult's own constructor runs ``normalize_json`` over the arguments,
    matching each value against abstract base classes, on every enqueue and
    every run; arguments checked at enqueue or decoded from an envelope need
    none of it.
    """
    errors = [] if errors is None else errors
    worker_ids = [] if worker_ids is None else worker_ids
    if _SLOTS is None:
        return TaskResult(task=task, id=job_id, status=status, enqueued_at=enqueued_at, started_at=started_at,
                          finished_at=None, last_attempted_at=last_attempted_at, args=args, kwargs=kwargs,
                          backend=backend, errors=errors, worker_ids=worker_ids)
    s_task, s_id, s_status, s_enqueued, s_started, s_finished, s_attempted, s_args, s_kwargs, s_backend, \
        s_errors, s_workers, s_return = _SLOTS
    result = _new(TaskResult)
    s_task(result, task)
    s_id(result, job_id)
    s_status(result, status)
    s_enqueued(result, enqueued_at)
    s_started(result, started_at)
    s_finished(result, None)
    s_attempted(result, last_attempted_at)
    s_args(result, args)
    s_kwargs(result, kwargs)
    s_backend(result, backend)
    s_errors(result, errors)
    s_workers(result, worker_ids)
    s_return(result, None)
    return result


def _slot_setters() -> tuple[Callable[[TaskResult, Any], None], ...] | None:
    """The setter of each of TaskResult's slots, in ``_READY_FIELDS`` order then ``_return_value``.

    A slot's own setter skips the frozen dataclass's ``__setattr__`` and the
    lookup by name that ``object.__setattr__`` makes: half the cost of a
    TaskResult, built on every enqueue. None unless TaskResult has exactly
    these fields, each a slot: a Django that changes them gets its own constructor.
    """
    expected = [*((name, True, MISSING) for name in _READY_FIELDS), ("_return_value", False, None)]
    if [(f.name, f.init, f.default) for f in fields(TaskResult)] != expected:
        return None
    slots = [TaskResult.__dict__.get(name) for name, _, _ in expected]
    if not all(isinstance(slot, MemberDescriptorType) for slot in slots):
        return None
    return tuple(slot.__set__ for slot in slots)


_SLOTS = _slot_setters()
_new = object.__new__


def ms_to_datetime(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms else None


def was_cancelled(result: TaskResult) -> bool:
    """Whether a FAILED result is that of a cancelled job (its last error is ``JobCancelled``).

    Django's statuses have no CANCELLED, so a cancelled job reads FAILED, as
    Django's own backends would show a job that did not finish."""
    return result.status == TaskResultStatus.FAILED and bool(result.errors) and (
        result.errors[-1].exception_class_path == CANCELLED_CLASS)


def task_errors(records: list[dict[str, Any]]) -> list[TaskError]:
    """The engine's error history as Django's TaskError list."""
    return [TaskError(exception_class_path=e.get("class", ""), traceback=e.get("traceback", "")) for e in records]
