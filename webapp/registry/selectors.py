"""Reads of the model registry."""

from __future__ import annotations

from django.db.models import QuerySet

from webapp.registry.models import ModelVersion


def modelversion_list_active() -> QuerySet[ModelVersion]:
    """Every served version, one per model, by model slug."""
    return (ModelVersion.objects.filter(status=ModelVersion.Status.ACTIVE)
            .select_related("model").order_by("model__slug"))


def modelversion_get_active(*, slug: str) -> ModelVersion | None:
    return modelversion_list_active().filter(model__slug=slug).first()


def modelversion_served(*, admitted: ModelVersion, served_label: str | None) -> ModelVersion:
    """The version that answered a request admitted for ``admitted``: another one when the
    request ran during an activation on the worker of the version being replaced."""
    if not served_label or served_label == admitted.label or not served_label.isdigit():
        return admitted
    return ModelVersion.objects.filter(model_id=admitted.model_id, number=int(served_label)).first() or admitted


def modelversion_tokenizer(version: ModelVersion):
    """The version's tokenizer, rendering chats with the template staff set for it, if any
    (registry/chat_templates.py), else the checkpoint's own."""
    from webapp.registry.chat_templates import chat_template_of
    from webapp.registry.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(version.tokenizer_dir)
    template, stops = chat_template_of(version.chat_template_preset, version.chat_template)
    return tokenizer.with_chat_template(template, stops) if template else tokenizer
