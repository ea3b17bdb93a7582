from django.apps import AppConfig


class UsageConfig(AppConfig):
    """One record per API request: tokens, latency, time to first token, outcome."""

    name = "webapp.usage"
    label = "usage"
    default_auto_field = "django.db.models.BigAutoField"
