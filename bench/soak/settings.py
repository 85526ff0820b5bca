"""The soak's Django settings: the project's, plus the soak's tasks app, queues, results and schedules.

The soak starts its own redis-server and its own SQLite file, and passes
both in the environment (``REDIS_URL``, ``DATABASE_URL``) before anything
reads these settings: the producer (the soak itself) and every
``runworker`` process then agree on where everything is.

Results are kept (``RESULT_TTL``) so that the verdict can compare what
``get_result()`` says with the ledger. DEBUG is off, as in production.
"""

from config.settings import *  # noqa: F403

from .kinds import KINDS, QUEUES, SCHEDULES

DEBUG = False
INSTALLED_APPS = [*INSTALLED_APPS, "bench.soak"]  # noqa: F405  (runworker finds bench/soak/tasks.py)
TASKS = {
    "default": {
        "BACKEND": "chasqui_core.backend.ChasquiBackend",
        "QUEUES": [*TASKS["default"]["QUEUES"], *QUEUES],  # noqa: F405  (the project's apps keep theirs)
        "OPTIONS": {"RESULT_TTL": 3600},
    },
}
CHASQUI = {
    "LIMITS": {
        f"bench.soak.tasks.{kind.task}": {"concurrency": kind.concurrency or None,
                                          "rate": f"{kind.rate}/s" if kind.rate else None}
        for kind in KINDS if kind.concurrency or kind.rate
    },
    "SCHEDULES": {
        name: {"task": f"bench.soak.tasks.{kind}", "every": every, "attempts": 2, "misfire": "skip"}
        for name, (kind, every) in SCHEDULES.items()
    },
}
