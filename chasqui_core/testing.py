"""Task backends for a project's tests: Django's own, made to accept Chasqui's task options.

A task declared with Chasqui's options (``@task(max_attempts=5, backoff=500)``)
cannot be defined under Django's ``ImmediateBackend`` or ``DummyBackend``,
whose task class does not know those arguments. These subclasses use
Chasqui's task class and otherwise behave exactly as Django's: in test
settings,

    TASKS = {"default": {"BACKEND": "chasqui_core.testing.ImmediateBackend"}}

runs each task at once, in the caller, on ``enqueue()``; ``DummyBackend``
records enqueued jobs without running them. Neither retries: a failing task
fails its one run, which is what a test of the task wants to see.

A task that takes its context gets one with Chasqui's additions too
(``LocalContext``): ``cancelled`` is always false, ``check_cancelled()``
does nothing, and ``report_progress()`` checks its arguments as a worker
would and keeps the reports on ``context.reports``, for the test to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.tasks import TaskContext
from django.tasks.backends.dummy import DummyBackend as DjangoDummyBackend
from django.tasks.backends.immediate import ImmediateBackend as DjangoImmediateBackend

from chasqui_core.task import ChasquiTask
from chasqui_core.engine.jobs import progress


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalContext(TaskContext):
    """The context of a task run by these backends: Chasqui's context methods, with nothing to cancel."""

    reports: list[tuple[float, str]] = field(default_factory=list)
    """Every ``report_progress`` of the run, in order."""

    @property
    def cancelled(self) -> bool:
        return False

    def check_cancelled(self) -> None:
        """Nothing cancels a run here."""

    def report_progress(self, value: float, message: str = "") -> None:
        self.reports.append(progress.check(value, message))


class LocalTask(ChasquiTask):
    """Chasqui's task class, handing a task that takes its context a ``LocalContext``."""

    __slots__ = ()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return super().call(*_local(self, args), **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return await super().acall(*_local(self, args), **kwargs)


def _local(task: ChasquiTask, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if task.takes_context and args and type(args[0]) is TaskContext:
        return (LocalContext(task_result=args[0].task_result), *args[1:])
    return args


class ImmediateBackend(DjangoImmediateBackend):
    """Django's ImmediateBackend for tasks declared with Chasqui's options."""

    task_class = LocalTask


class DummyBackend(DjangoDummyBackend):
    """Django's DummyBackend for tasks declared with Chasqui's options."""

    task_class = LocalTask
