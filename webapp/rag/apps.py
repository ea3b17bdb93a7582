from django.apps import AppConfig


class RagConfig(AppConfig):
    """Retrieval over documents attached to chats: chunks, their keyword index, cited passages."""

    name = "webapp.rag"
    label = "rag"
    default_auto_field = "django.db.models.BigAutoField"
