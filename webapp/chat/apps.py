from django.apps import AppConfig


class ChatConfig(AppConfig):
    """The chat page: saved conversations, streamed over a WebSocket from the engine workers."""

    name = "webapp.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"
