from django.apps import AppConfig


class ChasquiCoreConfig(AppConfig):
    """Chasqui's Django integration (task backend, worker command).

    Listed first in INSTALLED_APPS so that its ``runworker`` command takes
    precedence over the one from Channels.
    """

    name = "chasqui_core"
    verbose_name = "Chasqui"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        post_migrate.connect(_ensure_groups, sender=self)


def _ensure_groups(**kwargs) -> None:
    """Recreate the operator and viewer groups after every migrate (and test database flush)."""
    from chasqui_core.access import ensure_groups

    ensure_groups()
