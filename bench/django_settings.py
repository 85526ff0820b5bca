"""The project's settings plus the bench's tasks app, for the Django-path scenarios and their runworker."""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405  (runworker finds bench/tasks.py)
TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], "bench-django"]}}  # noqa: F405
