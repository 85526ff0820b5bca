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

        from chasqui_core.checks import other_settings, redis_url, runworker_command, signing_keys
        from chasqui_core.schedules import check_schedules

        post_migrate.connect(_ensure_groups, sender=self)
        checks.register(check_schedules)
        checks.register(signing_keys, checks.Tags.security)
        checks.register(redis_url)
        checks.register(runworker_command)
        checks.register(other_settings)
        # A mistake in the settings is not raised here, where it would be a traceback before any check ran:
        # `check` and every command that runs checks (runworker, migrate, runserver) report it in words and
        # stop, and a server process that runs none refuses its first use of Chasqui with the same words.


def _ensure_groups(**kwargs) -> None:
    """Recreate the operator and viewer groups after every migrate (and test database flush)."""
    from chasqui_core.access import ensure_groups

    ensure_groups()
