from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator console.

    In this repository the package is ``dashboard``; the installed ``chasqui``
    distribution ships it as ``chasqui_core.dashboard``, so that a project's own
    ``dashboard`` app keeps its name. The name follows the package, and the
    label is Chasqui's own, so neither clashes with a project's app.
    """

    name = __name__.rpartition(".")[0]
    label = "chasqui_console"
    verbose_name = "Chasqui console"
