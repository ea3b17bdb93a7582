from django.apps import AppConfig


class OrgsConfig(AppConfig):
    """Organisations, their teams and the teams' members (owner, admin, member)."""

    name = "webapp.orgs"
    label = "orgs"
    default_auto_field = "django.db.models.BigAutoField"
