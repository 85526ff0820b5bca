import os
import time
from pathlib import Path

from django.apps import AppConfig


class SupervisorTestsConfig(AppConfig):
    name = "tests.supervisor.app"
    label = "supervisor_tests"
    verbose_name = "Supervisor test tasks"

    def ready(self) -> None:
        """A worker process (never the supervisor) started while the hook file exists starts slowly, or fails."""
        from chasqui_core.supervised_child import SUPERVISOR_PID_ENV
        from tests.supervisor.app import START_HOOK_ENV, STARTS

        hook = os.environ.get(START_HOOK_ENV)
        if not hook or SUPERVISOR_PID_ENV not in os.environ:
            return
        try:
            what = Path(hook).read_text().strip()
        except FileNotFoundError:
            return
        if what == "fail":
            os._exit(3)
        began = time.time()
        time.sleep(float(what))
        from chasqui_core.engine.store.connection import connect

        connect(os.environ["REDIS_URL"]).rpush(STARTS, f"{os.getpid()}:{began}:{time.time()}")
