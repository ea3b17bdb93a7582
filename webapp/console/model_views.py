"""The console's models page (staff only): versions with their validation state, upload, (de)activate, delete."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import ValidationError
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.registry.models import Model, ModelVersion
from webapp.registry.services import (modelversion_activate, modelversion_deactivate, modelversion_delete,
                                      modelversion_upload)

VERSION_FIELDS = ("id", "number", "format", "status", "step", "progress", "error", "validation", "path")


def version_rows() -> list[dict]:
    """One dict per version, newest first within each model, models by slug."""
    rows = ModelVersion.objects.select_related("model").order_by("model__slug", "-number")
    return [{"model": v.model.slug, **{f: getattr(v, f) for f in VERSION_FIELDS}} for v in rows]


def _message(error: ValidationError) -> str:
    return " ".join(error.messages)


@staff_member_required
def models_page(request):
    if request.method == "POST":
        return _upload(request)
    return render(request, "console/models.html", {
        "models": Model.objects.order_by("slug"), "rows": version_rows(), "page": "models"})


def _upload(request):
    slug, uploaded = request.POST.get("model_slug", "").strip(), request.FILES.get("file")
    try:
        if not slug or uploaded is None:
            raise ValidationError("choose a model name and a file to upload")
        try:
            engine_settings = json.loads(request.POST.get("engine_settings") or "{}")
        except ValueError as exc:
            raise ValidationError(f"engine settings are not valid JSON: {exc}") from exc
        version = modelversion_upload(model_slug=slug, uploaded_file=uploaded,
                                      engine_settings=engine_settings)
    except ValidationError as error:
        messages.error(request, f"Upload refused: {_message(error)}")
    else:
        messages.success(request, f"Uploaded {version}; validating.")
    return redirect("console:models")


@staff_member_required
def models_json(request):
    """What the models page polls while a version is validating."""
    return JsonResponse({"versions": version_rows()})


ACTIONS = {"activate": modelversion_activate, "deactivate": modelversion_deactivate}


@staff_member_required
@require_POST
def version_action(request, version_id: int, action: str):
    version = get_object_or_404(ModelVersion.objects.select_related("model"), pk=version_id)
    label = str(version)
    try:
        if action == "delete":
            modelversion_delete(version=version)
        elif action in ACTIONS:
            ACTIONS[action](version=version)
        else:
            raise Http404("unknown action")
    except ValidationError as error:
        messages.error(request, f"Cannot {action} {label}: {_message(error)}")
    else:
        messages.success(request, f"{label}: {action} done.")
    return redirect("console:models")
