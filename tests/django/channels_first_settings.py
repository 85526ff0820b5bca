"""The project's settings with ``channels`` listed above ``chasqui_core``: the order that shadows our runworker."""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if not app.startswith("chasqui_core")]  # noqa: F405
INSTALLED_APPS.insert(INSTALLED_APPS.index("channels") + 1, "chasqui_core.apps.ChasquiCoreConfig")
