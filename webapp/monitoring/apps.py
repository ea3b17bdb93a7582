from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    """Health and readiness checks, Prometheus /metrics, and the metric snapshots behind the console's charts."""

    name = "webapp.monitoring"
    label = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"
