"""The Django Task the ``task-enqueue`` scenario enqueues (Django must be set up first)."""

from __future__ import annotations

from django.tasks import task


@task(queue_name="default")
def noop(i: int) -> None:
    """Does nothing: the scenario measures what enqueueing costs."""
