from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The staff console: workers, metrics, usage, models and keys pages."""

    name = "webapp.console"
    label = "console"
    verbose_name = "Admin console"
