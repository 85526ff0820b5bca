from django.apps import AppConfig


class ConsoleE2EConfig(AppConfig):
    name = "tests.dashboard.e2e_app"
    label = "console_e2e"
    verbose_name = "Console browser-test tasks"
