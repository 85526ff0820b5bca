"""The project's settings plus the bench's tasks app, for the Django-path scenarios and their runworker.

DEBUG is off, as in production. Logging is the project's own: ``django.tasks``
at WARNING, ``chasqui`` at INFO, so a retried job's line is printed as a user
would see it (the worker caps such lines per second and sums up the rest).
Every signal receiver runs.
"""

from config.settings import *  # noqa: F403

from .soak.kinds import QUEUES as SOAK_QUEUES

QUEUE = "bench-django"  # bench.tasks.QUEUE (that module needs these settings loaded, so it cannot be imported here)
DEBUG = False
INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405  (runworker finds bench/tasks.py)
# The soak's queues too, so that bench/soak/tasks.py loads under these settings (the import-graph test loads every
# module of bench/ with them); the soak itself runs on bench/soak/settings.py.
TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], QUEUE, *SOAK_QUEUES]}}  # noqa: F405
