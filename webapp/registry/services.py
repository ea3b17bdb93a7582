"""Writes to the model registry: register a checkpoint, export its tokenizer, (de)activate it."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from workers.schema import BUNDLED_MODELS, CONVERT_DTYPES, DEFAULT_BUNDLED_MODEL, ModelLoadError
from workers.schema import bundled_model_path as engine_bundled_path
from webapp.audit.services import audit_record
from webapp.registry.engine_settings import validate_engine_settings
from webapp.registry.models import Model, ModelVersion
from webapp.registry.uploads import move_into_place, unpack_upload

BUNDLED_SLUG = DEFAULT_BUNDLED_MODEL
TOKENIZER_EXPORT_TIMEOUT_S = 600

logger = logging.getLogger(__name__)


def checkpoint_format(path: str | Path) -> str:
    """"gguf" for a .gguf file, "hf" for a directory with config.json; ValidationError otherwise."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ModelVersion.Format.GGUF
    if path.is_dir() and (path / "config.json").is_file():
        return ModelVersion.Format.HF
    raise ValidationError(
        f"{str(path)!r} is neither a .gguf file nor a Hugging Face directory with config.json",
        code="invalid_path")


def bundled_model_path() -> Path:
    """The bundled SmolLM2 GGUF, located without importing its package (which imports llama_cpp)."""
    try:
        return engine_bundled_path(BUNDLED_SLUG)
    except ModelLoadError as exc:
        raise ValidationError(str(exc), code="bundled_model_missing") from exc


def model_create(*, slug: str, name: str = "") -> Model:
    model = Model(slug=slug, name=name)
    model.full_clean()
    model.save()
    return model


def _next_version_number(model: Model) -> int:
    """The number the model's next version gets; call inside a transaction: the model's row stays
    locked until it commits, so two registrations cannot pick the same number."""
    Model.objects.select_for_update().get(pk=model.pk)
    return (model.versions.aggregate(n=Max("number"))["n"] or 0) + 1


@transaction.atomic
def modelversion_create(*, model: Model, path: str | Path, engine_settings: dict | None = None) -> ModelVersion:
    path = Path(path).expanduser().resolve()
    fmt = checkpoint_format(path)
    engine_settings = validate_engine_settings(engine_settings or {})
    return ModelVersion.objects.create(model=model, number=_next_version_number(model), path=str(path),
                                       format=fmt, engine_settings=engine_settings)




def modelversion_upload(*, model_slug: str, uploaded_file, engine_settings: dict | None = None,
                        convert_dtype: str | None = None) -> ModelVersion:
    """Store an uploaded checkpoint under MEDIA_ROOT/models/<slug>/v<n>/ and queue its validation.

    ``uploaded_file`` is a Django File: a .gguf, or a zip / tar(.gz) of a Hugging Face directory
    (see registry.uploads for what is refused). The version starts as "validating"; the
    registry.validate_model_version task moves it to "ready" or "failed". ``convert_dtype``
    (float16, bfloat16 or float32; Hugging Face checkpoints only) has that task rewrite the
    safetensors shards in that dtype before validating them.
    """
    engine_settings = validate_engine_settings(engine_settings or {})
    convert_dtype = convert_dtype or None
    if convert_dtype is not None and convert_dtype not in CONVERT_DTYPES:
        raise ValidationError(f"cannot convert to {convert_dtype!r}; choose one of {', '.join(CONVERT_DTYPES)}",
                              code="invalid_dtype")
    validate_slug(model_slug)  # before it becomes part of a path
    models_dir = Path(settings.MEDIA_ROOT) / "models" / model_slug
    staging = models_dir / f".upload-{uuid.uuid4().hex}"
    try:
        checkpoint = unpack_upload(uploaded_file, staging)
        if convert_dtype is not None and checkpoint_format(checkpoint) == ModelVersion.Format.GGUF:
            raise ValidationError("dtype conversion applies to Hugging Face safetensors checkpoints; a "
                                  "GGUF file keeps the quantisation it was made with; upload it without "
                                  "conversion", code="gguf_conversion")
        with transaction.atomic():
            model = Model.objects.filter(slug=model_slug).first() or model_create(slug=model_slug)
            number = _next_version_number(model)
            path = move_into_place(checkpoint, models_dir / f"v{number}")
            version = ModelVersion.objects.create(
                model=model, number=number, path=str(path.resolve()), format=checkpoint_format(path),
                is_uploaded=True,
                engine_settings=engine_settings, status=ModelVersion.Status.VALIDATING, step="queued",
                validation={"convert_dtype": convert_dtype} if convert_dtype else {})
            transaction.on_commit(lambda: _queue_validation(version.pk))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return version


def modelversion_register_path(*, model_slug: str, path: str, engine_settings: dict | None = None) -> ModelVersion:
    """Register a checkpoint already on the server (a .gguf file or a Hugging Face directory) as a
    new version and queue the same validation an upload gets.

    The files stay where they are and are never rewritten (so no dtype conversion) nor deleted
    with the version. The path must be absolute: a relative one would depend on the server's
    working directory.
    """
    engine_settings = validate_engine_settings(engine_settings or {})
    validate_slug(model_slug)
    if not path or not Path(path).is_absolute():
        raise ValidationError(f"{path!r} is not an absolute path on the server", code="relative_path")
    resolved = Path(path).resolve()
    if not resolved.exists():
        raise ValidationError(f"{path!r} does not exist on the server", code="missing_path")
    fmt = checkpoint_format(resolved)
    with transaction.atomic():
        model = Model.objects.filter(slug=model_slug).first() or model_create(slug=model_slug)
        version = ModelVersion.objects.create(
            model=model, number=_next_version_number(model), path=str(resolved), format=fmt,
            engine_settings=engine_settings, status=ModelVersion.Status.VALIDATING, step="queued")
        transaction.on_commit(lambda: _queue_validation(version.pk))
    return version


def _queue_validation(version_id: int) -> None:
    from webapp.config.embedded_jobs import enqueue
    from webapp.registry.tasks import validate_model_version

    enqueue(validate_model_version, version_id)


def upload_dir_for(version: ModelVersion) -> Path:
    """Where modelversion_upload stores a version's files (its path is this folder or a file in it)."""
    return Path(settings.MEDIA_ROOT) / "models" / version.model.slug / f"v{version.number}"


def modelversion_delete(*, version: ModelVersion) -> None:
    """Forget a version and remove the files Pagoda stored for it; refused while it is served.

    Only an upload's own folder (MEDIA_ROOT/models/<slug>/v<n>/, and only when the version's path
    is inside it) and its tokenizer export are removed. A registered path is left in place even
    when it lies under MEDIA_ROOT, e.g. another version's upload folder or the whole models/ tree.
    """
    version.refresh_from_db(fields=["status"])
    if version.status == ModelVersion.Status.ACTIVE:
        raise ValidationError(f"{version} is active; deactivate it before deleting it",
                              code="version_active")
    doomed = [tokenizer_dir_for(version)]
    if version.is_uploaded:
        upload_dir = upload_dir_for(version).resolve()
        stored = Path(version.path).resolve()
        uploads_root = (Path(settings.MEDIA_ROOT) / "models").resolve()
        if uploads_root in upload_dir.parents and (stored == upload_dir or upload_dir in stored.parents):
            doomed.append(upload_dir)
    with transaction.atomic():
        audit_record(action="modelversion.delete", target=version, before={"path": version.path,
                                                                           "status": version.status})
        version.delete()
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)


def tokenizer_dir_for(version: ModelVersion) -> Path:
    return Path(settings.MEDIA_ROOT) / "tokenizers" / f"{version.model.slug}-v{version.number}-{version.pk}"


def modelversion_prepare_tokenizer(*, version: ModelVersion) -> ModelVersion:
    """Export the checkpoint's tokenizer and chat template to plain files, once per version.

    The web process must not import transformers (nor torch), so the export runs in a child
    interpreter (``python -m engine.cli.tokenizer_export``); webapp.registry.tokenizers then reads
    the files with the ``tokenizers`` library and jinja2. Runs outside any transaction: a GGUF
    export takes seconds.
    """
    if version.tokenizer_dir and (Path(version.tokenizer_dir) / "tokenizer.json").is_file():
        return version
    out_dir = tokenizer_dir_for(version)
    command = [sys.executable, "-m", "engine.cli.tokenizer_export", version.path, str(out_dir)]
    try:
        result = subprocess.run(command, cwd=settings.BASE_DIR, capture_output=True, text=True,
                                timeout=TOKENIZER_EXPORT_TIMEOUT_S)
        failure = None if result.returncode == 0 else (result.stderr.strip() or result.stdout.strip())
    except subprocess.TimeoutExpired:
        failure = f"the tokenizer export took longer than {TOKENIZER_EXPORT_TIMEOUT_S} s"
    if failure is not None:
        last_line = failure.splitlines()[-1] if failure else "no output"
        version.status, version.error = ModelVersion.Status.FAILED, f"tokenizer export failed: {last_line}"
        version.save(update_fields=["status", "error"])
        raise ValidationError(version.error, code="tokenizer_export_failed")
    version.tokenizer_dir, version.error = str(out_dir), ""
    version.save(update_fields=["tokenizer_dir", "error"])
    return version


def _serve_after_commit(slug: str) -> None:
    """Once the change is committed, embedded mode's worker for ``slug`` follows it.

    Distributed mode needs nothing here: ``run_engine_worker`` polls the active version itself.
    """
    from webapp.registry.embedded import sync_embedded_worker

    def sync() -> None:
        try:
            sync_embedded_worker(slug)
        except Exception:  # the change is committed; the workers page shows the model unserved
            logger.exception("the embedded worker of %s could not follow the registry", slug)

    transaction.on_commit(sync)


def modelversion_activate(*, version: ModelVersion) -> ModelVersion:
    """Serve ``version`` for its model; the previously active version becomes inactive.

    The model's workers follow: the new version loads while the old one keeps serving, then the
    old one finishes its running requests and stops (embedded mode right after the commit,
    distributed mode within run_engine_worker's poll interval).
    """
    if version.status in (ModelVersion.Status.VALIDATING, ModelVersion.Status.FAILED):
        raise ValidationError(f"{version} is {version.status}; only a validated version can be served",
                              code="version_not_ready")
    modelversion_prepare_tokenizer(version=version)
    with transaction.atomic():
        Model.objects.select_for_update().get(pk=version.model_id)
        (ModelVersion.objects.filter(model_id=version.model_id, status=ModelVersion.Status.ACTIVE)
         .exclude(pk=version.pk).update(status=ModelVersion.Status.INACTIVE))
        before = version.status
        version.status, version.activated_at = ModelVersion.Status.ACTIVE, timezone.now()
        version.save(update_fields=["status", "activated_at"])
        audit_record(action="modelversion.activate", target=version, before={"status": before},
                     after={"status": version.status})
        _serve_after_commit(version.model.slug)
    return version


def modelversion_deactivate(*, version: ModelVersion) -> ModelVersion:
    """Stop serving ``version``; if it was the active one, the model's workers drain."""
    with transaction.atomic():
        Model.objects.select_for_update().get(pk=version.model_id)
        version.refresh_from_db(fields=["status"])
        was_active = version.status == ModelVersion.Status.ACTIVE
        if version.status in (ModelVersion.Status.VALIDATING, ModelVersion.Status.FAILED):
            raise ValidationError(f"{version} is {version.status}; there is nothing to deactivate",
                                  code="version_not_active")
        before = version.status
        version.status = ModelVersion.Status.INACTIVE
        version.save(update_fields=["status"])
        audit_record(action="modelversion.deactivate", target=version, before={"status": before},
                     after={"status": version.status})
        if was_active:
            _serve_after_commit(version.model.slug)
    return version


def modelversion_update_settings(*, version: ModelVersion, engine_settings: dict) -> ModelVersion:
    """Replace a version's engine settings (validated; ValidationError names the bad setting).

    Allowed on the active version too: its workers then swap to the new settings the way an
    activation swaps versions (new worker loads, old one drains), so no request fails.
    """
    engine_settings = validate_engine_settings(engine_settings)
    with transaction.atomic():
        Model.objects.select_for_update().get(pk=version.model_id)
        version.refresh_from_db(fields=["status", "engine_settings"])
        before = version.engine_settings
        version.engine_settings = engine_settings
        version.save(update_fields=["engine_settings"])
        audit_record(action="modelversion.settings", target=version, before={"engine_settings": before},
                     after={"engine_settings": engine_settings})
        if version.status == ModelVersion.Status.ACTIVE:
            _serve_after_commit(version.model.slug)
    return version


def modelversion_set_chat_template(*, version: ModelVersion, preset: str, template: str = "") -> ModelVersion:
    """Set the chat template a version's chats render with (ValidationError naming the field when
    the preset is unknown, or the template does not render, or its stop tokens are not words of
    the model's vocabulary). Read per request: no worker restarts."""
    from webapp.registry.chat_templates import CUSTOM, chat_template_validate
    from webapp.registry.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(version.tokenizer_dir) if version.tokenizer_dir else None
    chat_template_validate(preset=preset, template=template, tokenizer=tokenizer)
    version.chat_template_preset = preset
    version.chat_template = template if preset == CUSTOM else ""
    version.save(update_fields=["chat_template_preset", "chat_template"])
    return version


def model_register(*, slug: str, path: str | Path, engine_settings: dict | None = None,
                   name: str = "", activate: bool = True) -> ModelVersion:
    """Idempotent: the same path and settings reuse the existing version instead of adding one."""
    path = Path(path).expanduser().resolve()
    engine_settings = validate_engine_settings(engine_settings or {})
    model = Model.objects.filter(slug=slug).first() or model_create(slug=slug, name=name)
    version = (model.versions.filter(path=str(path), engine_settings=engine_settings)
               .exclude(status=ModelVersion.Status.FAILED).order_by("-number").first())
    if version is None:
        version = modelversion_create(model=model, path=path, engine_settings=engine_settings)
    if activate and version.status != ModelVersion.Status.ACTIVE:
        return modelversion_activate(version=version)
    return modelversion_prepare_tokenizer(version=version)


def bundled_model_ensure() -> ModelVersion:
    """Register and activate the bundled SmolLM2 as ``smollm2`` (what ``make run`` serves)."""
    return model_register(slug=BUNDLED_SLUG, path=bundled_model_path(),
                          name=BUNDLED_MODELS[BUNDLED_SLUG].title)
