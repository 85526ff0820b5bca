"""Settings of the bench's Django project: the project's own, with the bench's tasks app and queue.

Two changes make it run like production rather than like a laptop, and like
the engine scenarios it is compared with: DEBUG is off, and per-job log
lines are off (the ``django.tasks`` and ``chasqui`` loggers at WARNING; the
engine scenarios and the peers log nothing per job either). Django's signal
receivers, its logging ones included, still run for every job.
"""

from __future__ import annotations

import copy

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS, LOGGING, TASKS

from bench.django_app import QUEUE

DEBUG = False

INSTALLED_APPS = [*INSTALLED_APPS, "bench.django_app"]

TASKS = copy.deepcopy(TASKS)
TASKS["default"]["QUEUES"] = [*TASKS["default"].get("QUEUES", []), QUEUE]

LOGGING = copy.deepcopy(LOGGING)
LOGGING["loggers"]["django.tasks"] = {"level": "WARNING"}  # its records still reach the "django" handlers
LOGGING["loggers"]["chasqui"] = {**LOGGING["loggers"]["chasqui"], "level": "WARNING"}
