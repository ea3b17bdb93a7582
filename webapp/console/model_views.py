"""The console's models page (staff only): versions with their validation state, upload, (de)activate,
delete, and each version's engine settings (context length, dtype, block size, KV budget, batch limits)."""

from __future__ import annotations

import math

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from workers.schema import SETTINGS_BY_NAME, InvalidParameterError, ModelLoadError, estimate_memory
from webapp.console.access import staff_required
from webapp.openai_api.body import JsonInputError, json_read
from webapp.registry.chat_templates import CHOICES as CHAT_TEMPLATE_CHOICES
from webapp.registry.models import Adapter, Model, ModelVersion
from webapp.registry.services import (CONVERT_DTYPES, modelversion_activate, modelversion_deactivate,
                                      modelversion_delete, modelversion_register_path,
                                      modelversion_set_chat_template, modelversion_update_settings,
                                      modelversion_upload)

VERSION_FIELDS = ("id", "number", "format", "status", "step", "progress", "error", "validation", "path",
                  "engine_settings", "chat_template_preset", "chat_template")
MIB = 1 << 20

# The engine settings the form edits: (setting, label, kind); their choices and ranges are the
# engine's schema (engine.config.SETTINGS). An empty field means the engine's default (the
# setting is removed); settings the form does not show are kept as they are.
FORM_SETTINGS = (
    ("max_model_len", "Context length (tokens)", "int"),
    ("dtype", "Dtype", "choice"),
    ("quantization", "Weight quantization", "choice"),
    ("block_size", "KV block size (tokens)", "choice"),
    ("kv_cache_dtype", "KV cache dtype", "choice"),
    ("kv_cache_memory", "KV cache budget (MiB)", "mib"),
    ("max_num_seqs", "Max running requests", "int"),
    ("max_num_batched_tokens", "Max batched tokens per step", "int"),
    ("tensor_parallel_size", "Tensor parallel ranks (processes)", "int"),
    ("speculative_tokens", "Draft tokens a step (0: no drafts)", "int"),
    ("speculative_model", "Draft model path (empty: prompt lookup)", "text"),
)
CHOICES = {name: tuple(map(str, SETTINGS_BY_NAME[name].choices)) for name, _, kind in FORM_SETTINGS
           if kind == "choice"}


def settings_form_fields(engine_settings: dict) -> list[dict]:
    """The form's fields with their current values (kv_cache_memory shown in MiB)."""
    fields = []
    for name, label, kind in FORM_SETTINGS:
        value = engine_settings.get(name)
        if kind == "mib" and value is not None:
            value = f"{value / MIB:g}"
        fields.append({"name": name, "label": label, "kind": kind, "choices": CHOICES.get(name, ()),
                       "value": "" if value is None else str(value)})
    return fields


def settings_from_form(data, base: dict, *, empty_resets: bool = True) -> dict:
    """``base`` with the form's settings applied; ValidationError naming the field for bad input.

    An empty field removes the setting (the engine's default) when ``empty_resets``; otherwise
    (the upload form, whose JSON box may carry the setting) it leaves ``base`` alone.

    The result still goes through validate_engine_settings (in the service), which names the
    setting for values of the right type but out of range.
    """
    result = dict(base)
    for name, label, kind in FORM_SETTINGS:
        if name not in data:
            continue
        raw = data.get(name, "").strip()
        if raw == "":
            if empty_resets:
                result.pop(name, None)
        elif SETTINGS_BY_NAME[name].type is str:
            result[name] = raw
        elif kind == "mib":
            try:
                mib = float(raw)
            except ValueError:
                mib = -1.0
            if not 0 < mib < math.inf or mib * MIB < 1:  # "1e400" reads as infinity
                raise ValidationError(f"{label} ({name}) must be a positive number of MiB, got {raw!r}")
            result[name] = int(mib * MIB)
        else:
            try:
                result[name] = int(raw)
            except ValueError:
                raise ValidationError(f"{label} ({name}) must be a whole number, got {raw!r}") from None
    return result


def version_rows() -> list[dict]:
    """One dict per version, newest first within each model, models by slug."""
    rows = ModelVersion.objects.select_related("model").order_by("model__slug", "-number")
    return [{"model": v.model.slug, **{f: getattr(v, f) for f in VERSION_FIELDS}} for v in rows]


def human_count(count: int) -> str:
    """A parameter count at a glance: 6365504 -> "6.37 M" (the page gives the exact count as a tooltip)."""
    if count < 1000:
        return str(count)
    for suffix, scale in (("K", 1e3), ("M", 1e6), ("B", 1e9)):
        text = f"{count / scale:.3g}"
        if "e" not in text:  # 999_600 would read "1e+03 K": the next unit says it better
            return f"{text} {suffix}"
    return f"{count / 1e12:.3g} T"


def _message(error: ValidationError) -> str:
    return " ".join(error.messages)


@staff_required
def models_page(request):
    if request.method == "POST":
        return _register_path(request) if request.POST.get("form") == "register-path" else _upload(request)
    rows = version_rows()
    for row in rows:
        row["settings_fields"] = settings_form_fields(row["engine_settings"])
        parameters = (row["validation"] or {}).get("parameters")
        if isinstance(parameters, int):
            row["parameters_human"], row["parameters_exact"] = human_count(parameters), f"{parameters:,}"
    return render(request, "console/models.html", {
        "models": Model.objects.order_by("slug"), "rows": rows, "page": "models",
        "upload_settings_fields": settings_form_fields({}), "convert_dtypes": CONVERT_DTYPES,
        "chat_template_choices": CHAT_TEMPLATE_CHOICES,
        "adapters": Adapter.objects.select_related("base")})


def _tell(request, attempt, refused: str) -> HttpResponse:
    """Run ``attempt`` (it returns what to say when it worked) and tell the models page how it went:
    a ValidationError becomes ``refused: <its message>``."""
    try:
        said = attempt()
    except ValidationError as error:
        messages.error(request, f"{refused}: {_message(error)}")
    else:
        messages.success(request, said)
    return redirect("console:models")


def _upload(request):
    def attempt() -> str:
        slug, uploaded = request.POST.get("model_slug", "").strip(), request.FILES.get("file")
        if not slug or uploaded is None:
            raise ValidationError("choose a model name and a file to upload")
        try:  # read as the API reads JSON: a number no setting can hold is refused naming it
            engine_settings = json_read(request.POST.get("engine_settings") or "{}")
        except JsonInputError as exc:
            where = f"engine settings: {exc.param}" if exc.param else "engine settings"
            raise ValidationError(f"{where} {exc.problem}") from exc
        if not isinstance(engine_settings, dict):
            raise ValidationError("engine settings must be a JSON object")
        engine_settings = settings_from_form(request.POST, engine_settings, empty_resets=False)
        version = modelversion_upload(model_slug=slug, uploaded_file=uploaded,
                                      engine_settings=engine_settings,
                                      convert_dtype=request.POST.get("convert_dtype", "").strip() or None)
        converting = (version.validation or {}).get("convert_dtype")
        return f"Uploaded {version}; {f'converting to {converting}, then ' if converting else ''}validating."

    return _tell(request, attempt, "Upload refused")


def _register_path(request):
    def attempt() -> str:
        slug, path = request.POST.get("model_slug", "").strip(), request.POST.get("path", "").strip()
        if not slug or not path:
            raise ValidationError("choose a model name and give the checkpoint's path on the server")
        version = modelversion_register_path(model_slug=slug, path=path,
                                             engine_settings=settings_from_form(request.POST, {}))
        return f"Registered {version} from {version.path}; validating."

    return _tell(request, attempt, "Registration refused")


@staff_required
def models_json(request):
    """What the models page polls while a version is validating."""
    return JsonResponse({"versions": version_rows()})


def staff_post(view):
    """A staff-only view that only answers POST."""
    return staff_required(require_POST(view))


def _version_write(request, version_id: int, verb: str, write, done) -> HttpResponse:
    """Run one write on a version (``write(version=...)``) and say on the models page how it went;
    ``done`` is the success message, or a function of the version giving it."""
    version = get_object_or_404(ModelVersion.objects.select_related("model"), pk=version_id)
    label = str(version)

    def attempt() -> str:
        write(version=version)
        return f"{label}: {done(version) if callable(done) else done}."

    return _tell(request, attempt, f"Cannot {verb} {label}")


@staff_post
def version_activate(request, version_id: int):
    return _version_write(request, version_id, "activate", modelversion_activate, "activate done")


@staff_post
def version_deactivate(request, version_id: int):
    return _version_write(request, version_id, "deactivate", modelversion_deactivate, "deactivate done")


@staff_post
def version_delete(request, version_id: int):
    return _version_write(request, version_id, "delete", modelversion_delete, "delete done")


def _settings_saved(version: ModelVersion) -> str:
    if version.status == ModelVersion.Status.ACTIVE:
        return "engine settings saved; its worker reloads with them while the current one finishes its requests"
    return "engine settings saved"


@staff_post
def version_update_settings(request, version_id: int):
    def save(*, version: ModelVersion) -> None:
        modelversion_update_settings(version=version,
                                     engine_settings=settings_from_form(request.POST, version.engine_settings))

    return _version_write(request, version_id, "save the engine settings of", save, _settings_saved)


@staff_post
def version_chat_template(request, version_id: int):
    """A preset (ChatML, Gemma, Llama 3), a custom jinja template, or the checkpoint's own."""
    def save(*, version: ModelVersion) -> None:
        modelversion_set_chat_template(version=version, preset=request.POST.get("chat_template_preset", ""),
                                       template=request.POST.get("chat_template", ""))

    return _version_write(request, version_id, "set the chat template of", save, "chat template saved")


@staff_required
def version_estimate(request, version_id: int):
    """The memory the version needs with the settings being edited (the form's fields as query
    parameters, over its saved settings): engine/memory/estimate.py, from the checkpoint's headers."""
    version = get_object_or_404(ModelVersion, pk=version_id)
    try:
        settings = settings_from_form(request.GET, dict(version.engine_settings))
        estimate = estimate_memory(version.path, settings)
    except ValidationError as exc:
        return JsonResponse({"ok": False, "error": _message(exc)}, status=400)
    except (InvalidParameterError, ModelLoadError) as exc:
        return JsonResponse({"ok": False, "error": str(exc)}, status=400)
    return JsonResponse({"ok": True, "text": estimate.describe(), **estimate.as_dict()})
