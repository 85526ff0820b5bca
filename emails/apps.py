from django.apps import AppConfig


class EmailsConfig(AppConfig):
    name = "emails"
    verbose_name = "Emails (demo)"
