"""Settings of the worker processes the supervisor's tests start: the project's, plus the test task's app."""

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS, TASKS

from tests.supervisor.app import QUEUE

INSTALLED_APPS = [*INSTALLED_APPS, "tests.supervisor.app.apps.SupervisorTestsConfig"]

TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], QUEUE]}}
