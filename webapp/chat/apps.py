from django.apps import AppConfig


def _ship_defaults(sender, instance, created, raw=False, **kwargs):
    """A newly registered model that Pagoda ships chat defaults for (the bundled one) gets them."""
    if created and not raw:
        from webapp.chat.models import ModelChatDefaults
        from webapp.chat.shipped_defaults import defaults_ship

        defaults_ship(model=instance, defaults_model=ModelChatDefaults)


class ChatConfig(AppConfig):
    """The chat page: saved conversations, streamed over a WebSocket from the engine workers."""

    name = "webapp.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_save

        post_save.connect(_ship_defaults, sender="registry.Model", dispatch_uid="chat-ship-defaults")
