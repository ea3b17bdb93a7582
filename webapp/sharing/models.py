"""Shared snapshots of conversations and the site's sharing setting."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


def new_token() -> str:
    return secrets.token_urlsafe(32)  # 256 random bits: the link is the only key


class SharingSettings(models.Model):
    """The one row of site-wide sharing settings (pk 1), edited by staff."""

    allow_anonymous = models.BooleanField(
        default=False, help_text="Anyone with a link may read the shared conversation without an account. "
                                 "Off: only logged-in users may open shared links.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "sharing settings"

    def __str__(self) -> str:
        return "sharing settings"


class SharedConversation(models.Model):
    """A read-only copy of a conversation as it was shown when shared; later edits never reach it."""

    token = models.CharField(max_length=64, unique=True, default=new_token, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shared_conversations")
    # Deleting the conversation deletes its links too: deleting is how people expect to unshare.
    conversation = models.ForeignKey("chat.Conversation", on_delete=models.CASCADE, related_name="shares")
    title = models.CharField(max_length=200, blank=True)
    messages = models.JSONField(default=list)  # [{"role", "content", "model"}] in the order shown
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return f"share of {self.title or self.conversation_id}"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
