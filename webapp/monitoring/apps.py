from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    """Health checks now; /readyz and Prometheus /metrics join it later."""

    name = "webapp.monitoring"
    label = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"
