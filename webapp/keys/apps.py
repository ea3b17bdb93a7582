from django.apps import AppConfig


class KeysConfig(AppConfig):
    """API keys: hashed at rest, scoped to models, expiring, revocable."""

    name = "webapp.keys"
    label = "keys"
    default_auto_field = "django.db.models.BigAutoField"
