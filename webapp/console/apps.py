from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "webapp.console"
    label = "console"
    verbose_name = "Admin console"
