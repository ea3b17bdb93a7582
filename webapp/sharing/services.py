"""Writes of sharing: create a snapshot link, revoke it, change the site setting."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from webapp.chat.models import Conversation
from webapp.chat.selectors import message_list, message_path
from webapp.sharing.models import SharedConversation, SharingSettings


class ShareInputError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def parse_message_ids(raw: str) -> list[int] | None:
    """``"12,13,15"`` -> [12, 13, 15]; empty -> None (share what the conversation holds)."""
    if not (raw or "").strip():
        return None
    try:
        ids = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise ShareInputError("messages", "messages must be a comma-separated list of message ids") from None
    if len(ids) != len(set(ids)):
        raise ShareInputError("messages", "messages lists a message twice")
    return ids


@transaction.atomic
def share_create(*, conversation: Conversation, message_ids: list[int] | None = None) -> SharedConversation:
    """Snapshot ``conversation`` for its owner: the messages ``message_ids`` in that order (the ones the
    page showed), else the path the conversation shows now (with branches, not all its messages)."""
    messages = message_path(conversation=conversation)
    if message_ids is not None:
        by_id = {m.pk: m for m in message_list(conversation=conversation)}
        unknown = [i for i in message_ids if i not in by_id]
        if unknown:
            raise ShareInputError("messages", f"messages {unknown} are not in this conversation")
        messages = [by_id[i] for i in message_ids]
    if not messages:
        raise ShareInputError("messages", "there is nothing to share yet: the conversation has no messages")
    return SharedConversation.objects.create(
        owner=conversation.user, conversation=conversation, title=str(conversation)[:200],
        messages=[{"role": m.role, "content": m.content, "model": m.model_name} for m in messages])


def share_revoke(*, share: SharedConversation) -> SharedConversation:
    if share.revoked_at is None:
        share.revoked_at = timezone.now()
        share.save(update_fields=["revoked_at"])
    return share


def sharing_settings_update(*, allow_anonymous: bool) -> SharingSettings:
    current, _ = SharingSettings.objects.update_or_create(pk=1, defaults={"allow_anonymous": allow_anonymous})
    return current
