"""A task for the supervisor's tests, installed only by ``tests.supervisor.settings``.

The names the tests need live here, so a test can import them without
importing the task (which only registers under those settings).
"""

QUEUE = "supervised"
NAP = "tests.supervisor.app.tasks.nap"
STARTED = "supervisor-tests:started"
"""List: ``<key>:<pid>`` pushed by each run of ``nap`` as it starts."""
DONE = "supervisor-tests:done"
"""List: ``<key>:<pid>`` pushed by each run of ``nap`` that finished."""
