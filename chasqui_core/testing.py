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
"""

from __future__ import annotations

from django.tasks.backends.dummy import DummyBackend as DjangoDummyBackend
from django.tasks.backends.immediate import ImmediateBackend as DjangoImmediateBackend

from chasqui_core.backend import ChasquiTask


class ImmediateBackend(DjangoImmediateBackend):
    """Django's ImmediateBackend for tasks declared with Chasqui's options."""

    task_class = ChasquiTask


class DummyBackend(DjangoDummyBackend):
    """Django's DummyBackend for tasks declared with Chasqui's options."""

    task_class = ChasquiTask
