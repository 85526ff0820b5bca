from django.apps import AppConfig


class ChasquiCoreConfig(AppConfig):
    """Chasqui's Django integration (task backend, worker command).

    Listed first in INSTALLED_APPS so that its ``runworker`` command takes
    precedence over the one from Channels.
    """

    name = "chasqui_core"
    verbose_name = "Chasqui"
