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
