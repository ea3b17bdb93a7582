"""LoRA adapters of registered models: the upload (a zip of a PEFT folder, checked against the
base's active version by ``python -m engine.cli.validate_adapter`` in a child, so this process never
imports torch) and how a request's ``model`` names one: ``"<base>:<adapter>"`` or the adapter's
own name. The base's workers serve its adapters (workers/protocol.py's GenerateRequest.adapter).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from webapp.registry.models import Adapter, Model
from webapp.registry.selectors import modelversion_get_active
from webapp.registry.uploads import ByteBudget, extract_zip, max_upload_bytes, refuse, store_upload

CONFIG_FILE = "adapter_config.json"
VALIDATE_TIMEOUT_S = 300


# ----------------------------------------------------------------- reads
def adapter_resolve(*, name: str) -> tuple[str, Adapter | None]:
    """(base model slug, the active adapter or None) for what a request calls ``model``: a model's
    slug as it is, ``"<base>:<adapter>"``, or an adapter's own name. An adapter that does not
    exist (or is switched off) under a colon name resolves to (that name, None), which no model has."""
    base_slug, colon, adapter_name = name.partition(":")
    if colon:
        adapter = Adapter.objects.select_related("base").filter(
            base__slug=base_slug, name=adapter_name, is_active=True).first()
        return (base_slug, adapter) if adapter is not None else (name, None)
    if Model.objects.filter(slug=name).exists():
        return name, None
    adapter = Adapter.objects.select_related("base").filter(name=name, is_active=True).first()
    return (adapter.base.slug, adapter) if adapter is not None else (name, None)


def adapter_list_active() -> list[Adapter]:
    """Active adapters whose base has an active version (those a request can reach)."""
    return [a for a in Adapter.objects.select_related("base").filter(is_active=True)
            if modelversion_get_active(slug=a.base.slug) is not None]


# ----------------------------------------------------------------- writes
def adapter_upload(*, base_slug: str, name: str, uploaded_file) -> Adapter:
    """Store a zip of a PEFT adapter folder for ``base_slug`` under MEDIA_ROOT/adapters/ and activate
    it once it fits the base's active version; ValidationError saying why otherwise (nothing kept)."""
    validate_slug(name)
    if Model.objects.filter(slug=name).exists() or Adapter.objects.filter(name=name).exists():
        raise ValidationError(f"the name {name!r} is taken by a model or an adapter", code="name_taken")
    base = Model.objects.filter(slug=base_slug).first()
    version = modelversion_get_active(slug=base_slug) if base is not None else None
    if version is None:
        raise ValidationError(f"the model {base_slug!r} has no active version to check the adapter "
                              f"against; activate it first", code="base_not_active")
    root = Path(settings.MEDIA_ROOT) / "adapters" / base_slug
    staging = root / f".upload-{uuid.uuid4().hex}"
    try:
        folder = _unpack(uploaded_file, staging)
        report = _validate(folder, version)
        if not report.get("ok"):
            raise ValidationError(f"the adapter does not fit {base_slug} ({version.label}): "
                                  f"{report.get('error', 'the check failed')}", code="adapter_mismatch")
        with transaction.atomic():
            destination = root / f"{name}-{uuid.uuid4().hex[:8]}"
            shutil.move(str(folder), str(destination))
            return Adapter.objects.create(base=base, name=name, path=str(destination.resolve()),
                                          rank=report["rank"], target_modules=report["target_modules"])
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def adapter_set_active(*, adapter: Adapter, is_active: bool) -> Adapter:
    adapter.is_active = is_active
    adapter.save(update_fields=["is_active"])
    return adapter


def _unpack(uploaded_file, staging: Path) -> Path:
    """The folder holding adapter_config.json in the uploaded zip (a single top folder flattened)."""
    name = Path(uploaded_file.name or "").name
    if not name.lower().endswith(".zip"):
        raise refuse(f"{name!r} is not a .zip of a PEFT adapter folder", "unsupported_upload")
    staging.mkdir(parents=True, exist_ok=True)
    archive = staging / "upload.zip"
    store_upload(uploaded_file.chunks(), archive, ByteBudget(max_upload_bytes()))
    root = staging / "adapter"
    root.mkdir()
    try:
        extract_zip(archive, root, ByteBudget(max_upload_bytes()))
    except zipfile.BadZipFile as exc:
        raise refuse(f"{name!r} is not a readable zip: {exc}", "invalid_archive") from exc
    entries = list(root.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (root / CONFIG_FILE).exists():
        root = entries[0]
    if not (root / CONFIG_FILE).is_file():
        raise refuse(f"{name!r} has no {CONFIG_FILE} at its top level (nor in a single top-level "
                     f"folder)", "not_an_adapter")
    return root


def _validate(folder: Path, version) -> dict:
    command = [sys.executable, "-m", "engine.cli.validate_adapter", str(folder), "--base", version.path]
    rank = (version.engine_settings or {}).get("max_lora_rank")
    if rank:
        command += ["--max-lora-rank", str(rank)]
    try:
        done = subprocess.run(command, cwd=settings.BASE_DIR, capture_output=True, text=True,
                              timeout=VALIDATE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the check took over {VALIDATE_TIMEOUT_S} s"}
    for line in reversed(done.stdout.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {"ok": False, "error": done.stderr.strip()[-500:] or "the check printed nothing"}
