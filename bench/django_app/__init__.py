"""The Django project the Django-path scenarios run: the project's settings plus this app.

``runworker`` runs only the tasks it finds in installed apps' ``tasks``
modules, so the bench's tasks live in an app of their own, installed by the
bench's settings module and nowhere else: the project's own workers never see
them.
"""

from __future__ import annotations

import os
from types import ModuleType

SETTINGS = "bench.django_app.settings"
QUEUE = "bench"
"""The queue of the bench's tasks (the engine scenarios use the same name)."""

TARGET_ENV = "BENCH_RUNWORKER_TARGET"
"""How many successful runs close a ``runworker`` process's measured window."""
MARKS_KEY = "bench:runworker:marks"
"""Hash: when (wall clock) and at what CPU time the first run started and the target-th run succeeded."""
DONE_KEY = "bench:runworker:done"
"""List pushed to when the target-th run succeeds, so the bench waits with BLPOP instead of polling."""


def setup() -> ModuleType:
    """Set Django up in this process with the bench's settings; return the tasks module."""
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS  # the bench's, whatever the shell exported
    import django

    django.setup()
    from . import tasks

    return tasks
