"""Reads of conversations; every read is scoped to its owner."""

from __future__ import annotations

from django.db.models import QuerySet

from webapp.chat.models import Conversation, Message


def conversation_list(*, user) -> QuerySet[Conversation]:
    return Conversation.objects.filter(user=user)


def conversation_get(*, user, conversation_id) -> Conversation | None:
    """The user's conversation, or None (another user's id reads as missing)."""
    try:
        return Conversation.objects.filter(user=user, pk=int(conversation_id)).first()
    except (TypeError, ValueError):
        return None


def message_list(*, conversation: Conversation) -> QuerySet[Message]:
    return conversation.messages.all()


def message_to_dict(message: Message) -> dict:
    return {"id": message.pk, "role": message.role, "content": message.content, "model": message.model_name,
            "prompt_tokens": message.prompt_tokens, "completion_tokens": message.completion_tokens,
            "cached_prompt_tokens": message.cached_prompt_tokens, "finish_reason": message.finish_reason}
