from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The HTTP API.

    In this repository the package is ``api``; the installed ``chasqui``
    distribution ships it as ``chasqui_core.api``, so that a project's own
    ``api`` app keeps its name. The name follows the package, and the label is
    Chasqui's own, so neither clashes with a project's app.
    """

    name = __name__.rpartition(".")[0]
    label = "chasqui_api"
    verbose_name = "Chasqui API"
