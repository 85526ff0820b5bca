"""Settings of the servers the console's browser tests start: the project's,
plus the test tasks on their own queue, and a quicker sampler so live changes
show sooner."""

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.dashboard.e2e_app.apps.ConsoleE2EConfig"]

TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], "payments"]}}

CHASQUI_SAMPLER_INTERVAL = 0.4

CHASQUI = {"SCHEDULES": {
    # Due at 03:00 on the first of the month: never during a test, so only "Run now" fires it.
    "monthly-statements": {"task": "tests.dashboard.e2e_app.tasks.charge", "cron": "0 3 1 * *", "args": [7],
                           "timezone": "America/Lima"},
}}
