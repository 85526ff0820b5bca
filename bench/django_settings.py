"""The project's settings plus the bench's tasks app, for the Django-path scenarios and their runworker.

Two changes make a worker run as in production and as its engine twin does:
DEBUG is off, and per-job log lines are off. The project logs ``django.tasks``
at WARNING already; the ``chasqui`` logger goes to WARNING here too, so a
retried job does not print a line either (the engine scenarios and the peers
print nothing per job). Every signal receiver still runs.
"""

from config.settings import *  # noqa: F403

QUEUE = "bench-django"  # bench.tasks.QUEUE (that module needs these settings loaded, so it cannot be imported here)
DEBUG = False
INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405  (runworker finds bench/tasks.py)
TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], QUEUE]}}  # noqa: F405
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"],  # noqa: F405
                                  "chasqui": {**LOGGING["loggers"]["chasqui"], "level": "WARNING"}}}  # noqa: F405
