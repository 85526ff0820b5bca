"""Settings of the ``devstack`` the tests start: the project's own, with local state in the test's folder.

``devstack`` keeps its Valkey's data under ``VAR_DIR``; the project's ``var/`` may hold a developer's
own data, which a test must never touch.
"""

import os
from pathlib import Path

from config.settings import *  # noqa: F403

VAR_DIR = Path(os.environ["CHASQUI_TEST_VAR_DIR"])
