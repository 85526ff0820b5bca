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
TICK = "tests.supervisor.app.tasks.tick"
TICKS = "supervisor-tests:ticks"
"""List: ``<key>:<pid>:<unix time>`` pushed by each run of ``tick`` (a sync task) as it starts."""
HANG = "tests.supervisor.app.tasks.hang"
"""A sync task that outlives its timeout of HANG_TIMEOUT seconds (one run: dead-lettered as timed out)."""
HANG_TIMEOUT = 1.0
HUNG = "supervisor-tests:hung"
"""List: the pid of each process a ``hang`` run started in."""
START_HOOK_ENV = "SUPERVISOR_TESTS_START_HOOK"
"""Path of a file a worker process reads as it starts, if it exists: ``fail`` makes it exit with code 3 before
it is ready, a number makes it sleep that many seconds (a slow start), recorded in STARTS."""
STARTS = "supervisor-tests:starts"
"""List: ``<pid>:<unix time the slow start began>:<unix time it ended>``."""
DOZE = "tests.supervisor.app.tasks.doze"
"""A sync task that sleeps and records its end in DONE (``<key>:<pid>``)."""
PILL = "tests.supervisor.app.tasks.pill"
"""A sync task that kills its worker process (``os._exit``), as a segfault in a C extension would."""
