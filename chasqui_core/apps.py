from django.apps import AppConfig


class ChasquiCoreConfig(AppConfig):
    """Chasqui's Django integration (task backend, worker command).

    Listed above ``channels`` in INSTALLED_APPS, so that its ``runworker``
    command takes precedence over the one Channels ships; the
    ``chasqui.E004`` system check stops any command when it does not.
    """

    name = "chasqui_core"
    verbose_name = "Chasqui"

    def ready(self) -> None:
        from django.core import checks
        from django.db.models.signals import post_migrate

        from chasqui_core.checks import redis_url, runworker_command, signing_keys
        from chasqui_core.conf import chasqui_settings
        from chasqui_core.schedules import check_schedules

        post_migrate.connect(_ensure_groups, sender=self)
        checks.register(check_schedules)
        checks.register(signing_keys, checks.Tags.security)
        checks.register(redis_url)
        checks.register(runworker_command)
        # A mistake in settings.CHASQUI stops the process at start, not at the first job or scrape.
        chasqui_settings()


def _ensure_groups(**kwargs) -> None:
    """Recreate the operator and viewer groups after every migrate (and test database flush)."""
    from chasqui_core.access import ensure_groups

    ensure_groups()
