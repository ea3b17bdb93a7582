from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The append-only audit log of every change made through the console, /admin/ and commands."""

    name = "webapp.audit"
    label = "audit"
    default_auto_field = "django.db.models.BigAutoField"
