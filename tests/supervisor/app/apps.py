from django.apps import AppConfig


class SupervisorTestsConfig(AppConfig):
    name = "tests.supervisor.app"
    label = "supervisor_tests"
    verbose_name = "Supervisor test tasks"
