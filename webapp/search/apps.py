from django.apps import AppConfig
from django.db.models.signals import post_migrate


class SearchConfig(AppConfig):
    """Search across a user's conversations through the database's own full-text search."""

    name = "webapp.search"
    label = "search"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.search.sqlite_fts import heal_after_migrate

        # A later migration of the chat app may rebuild its tables (SQLite's ALTER TABLE path
        # copies the table and drops the old one, and its triggers with it): put them back.
        post_migrate.connect(heal_after_migrate, sender=self, dispatch_uid="search-heal-fts-triggers")
