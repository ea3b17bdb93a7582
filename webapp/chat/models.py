"""Conversations of the chat page, saved per user."""

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    # The last settings used, so that reopening a conversation restores them.
    model_name = models.CharField(max_length=64, blank=True)
    system_prompt = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"conversation {self.pk}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    model_name = models.CharField(max_length=64, blank=True)  # which model answered (assistant messages)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_prompt_tokens = models.PositiveIntegerField(default=0)
    finish_reason = models.CharField(max_length=16, blank=True)  # "stop" | "length" | "abort" | ""
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]  # the order of the conversation

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"
