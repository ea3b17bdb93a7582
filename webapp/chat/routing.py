"""The chat page's WebSocket route (served by ChatConsumer under config.asgi)."""

from django.urls import path

from webapp.chat.consumers import ChatConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]
