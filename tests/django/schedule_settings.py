"""Settings of the ``runworker`` processes the schedule tests start: the project's, plus one schedule.

The schedule writes each run's job id to the file named by ``SCHEDULE_LOG`` (see sample_tasks.note_run).
"""

import os

from config.settings import *  # noqa: F403

CHASQUI = {"SCHEDULES": {"heartbeat": {"task": "tests.django.sample_tasks.note_run", "every": 1,
                                       "args": [os.environ.get("SCHEDULE_LOG", "")]}}}
