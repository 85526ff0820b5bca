"""Settings of the ``runworker`` processes the outbox tests start: the project's own, with the outbox on.

Only a worker whose settings turn the outbox on runs the relay, so the test's settings overrides
(which live in the test process) are not enough.
"""

from config.settings import *  # noqa: F403

TASKS = {"default": {**TASKS["default"], "OPTIONS": {"OUTBOX": True}}}  # noqa: F405
