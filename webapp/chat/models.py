"""Conversations of the chat page, saved per user.

A conversation is a tree of messages: editing a message or answering it again adds a sibling
(same parent), nothing is deleted. The page shows one path, from a root to ``current_leaf``;
the next turn continues from the end of the path shown.
"""

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    # The last settings used, so that reopening a conversation restores them.
    model_name = models.CharField(max_length=64, blank=True)
    system_prompt = models.TextField(blank=True)
    sampling = models.JSONField(default=dict, blank=True)  # the sampling settings of the last turn
    # The end of the path the page shows; None: the newest message.
    current_leaf = models.ForeignKey("Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
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
    # The message this one follows; None for a first message (and its edited versions).
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    # Documents attached to a user message, [{"name", "text"}]: their whole text joins its prompt.
    attachments = models.JSONField(default=list, blank=True)
    # The passages an answer's prompt carried, [{"n", "chunk", "document", "page"}]: its [n] markers
    # cite them (webapp.rag; empty when the documents were pasted whole).
    sources = models.JSONField(default=list, blank=True)
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

    def save(self, *args, **kwargs):
        # A new message saved without a parent follows the conversation's newest message, unless it
        # is marked ``root`` (a first message, or an edited version of one).
        if self._state.adding and self.parent_id is None and not getattr(self, "root", False):
            self.parent = Message.objects.filter(conversation_id=self.conversation_id).order_by("-id").first()
        super().save(*args, **kwargs)


class ModelChatDefaults(models.Model):
    """Staff's defaults for a model on the chat page: its sampling settings and system prompt.
    The page starts from them; a turn's own values win (chat.sampling checks both)."""

    model = models.OneToOneField("registry.Model", on_delete=models.CASCADE, related_name="chat_defaults")
    sampling = models.JSONField(default=dict, blank=True, help_text='e.g. {"temperature": 0.6, "top_k": 40}')
    system_prompt = models.TextField(blank=True)

    class Meta:
        verbose_name = "chat defaults of a model"
        verbose_name_plural = "chat defaults of models"

    def __str__(self) -> str:
        return f"chat defaults of {self.model}"

    def clean(self):
        from django.core.exceptions import ValidationError

        from webapp.chat.sampling import FIELDS, SamplingError, sampling_params

        if not isinstance(self.sampling, dict) or set(self.sampling) - set(FIELDS):
            raise ValidationError({"sampling": f"an object with some of: {', '.join(FIELDS)}"})
        try:
            sampling_params(self.sampling)
        except SamplingError as exc:
            raise ValidationError({"sampling": exc.message}) from None


class SystemPromptPreset(models.Model):
    """A named system prompt: the user's own, or everyone's when ``user`` is empty (made by staff).

    The engine's prefix cache is scoped to each user; staff may mark one of everyone's presets
    ``is_prefix_shared`` so that its cached blocks serve every user (webapp/chat/prefix_sharing.py).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="system_prompt_presets")
    name = models.CharField(max_length=80)
    text = models.TextField()
    is_prefix_shared = models.BooleanField(
        "share its prefix cache", default=False,
        help_text="Let every user's request that begins with exactly this system prompt (chat page or API) "
                  "reuse the engine's cached blocks of it. Anyone can then tell that someone used it recently "
                  "(from cached_tokens or a faster first token), never what followed it.")

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        from django.core.exceptions import ValidationError

        if self.is_prefix_shared and self.user_id is not None:
            raise ValidationError({"is_prefix_shared": "Only everyone's presets (no user) can share their cache."})
