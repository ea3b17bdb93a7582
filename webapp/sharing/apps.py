from django.apps import AppConfig


class SharingConfig(AppConfig):
    """Read-only links to snapshots of conversations, and the staff setting that opens them to anyone."""

    name = "webapp.sharing"
    label = "sharing"
    default_auto_field = "django.db.models.BigAutoField"
