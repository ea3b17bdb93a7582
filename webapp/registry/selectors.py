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
