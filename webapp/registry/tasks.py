"""Background jobs of the registry: validate an uploaded checkpoint in a child interpreter."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from webapp.registry.models import ModelVersion

VALIDATE_TIMEOUT_S = 3600
STDERR_TAIL_CHARS = 2000


@shared_task(name="registry.validate_model_version")
def validate_model_version(version_id: int) -> str:
    """Run ``python -m engine.cli.validate`` on the version's path; mirror its progress onto the row.

    The web process must not import torch, so the engine-side checks (config, tokenizer, tensor
    shapes, a 4-token forward pass) run in a child whose JSON lines arrive here one at a time.
    An upload that asked for a dtype conversion (``validation["convert_dtype"]``) has the child
    rewrite its shards first. Returns the final status.
    """
    version = ModelVersion.objects.get(pk=version_id)
    version.job_started_at, version.job_finished_at = timezone.now(), None
    version.save(update_fields=["job_started_at", "job_finished_at"])
    command = [sys.executable, "-m", "engine.cli.validate", version.path]
    convert_dtype = (version.validation or {}).get("convert_dtype")
    if convert_dtype:  # asked for at upload (services.modelversion_upload)
        command += ["--convert-dtype", convert_dtype]
    final: dict | None = None
    # stderr goes to a file: a pipe nobody reads while stdout is read would fill and stall the child.
    with tempfile.TemporaryFile(mode="w+") as stderr, subprocess.Popen(
            command, cwd=settings.BASE_DIR, stdout=subprocess.PIPE, stderr=stderr, text=True) as child:
        watchdog = threading.Timer(VALIDATE_TIMEOUT_S, child.kill)
        watchdog.start()
        try:
            for line in child.stdout:
                record = _parse(line)
                if record is None:
                    continue
                if "ok" in record:
                    final = record
                elif "step" in record:
                    version.step = str(record["step"])[:100]
                    version.progress = float(record.get("progress", version.progress))
                    version.save(update_fields=["step", "progress"])
            child.wait()
        finally:
            watchdog.cancel()
        stderr.seek(0)
        tail = stderr.read().strip()[-STDERR_TAIL_CHARS:]
    if final is None:
        reason = tail or f"exit status {child.returncode}"
        if child.returncode == -signal.SIGKILL:
            reason = f"validation took longer than {VALIDATE_TIMEOUT_S} s"
        final = {"ok": False, "error": f"the validator stopped without a result: {reason}"}
    return _finish(version, final)


def _parse(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None  # a library printing to stdout; not ours
    return record if isinstance(record, dict) else None


def _finish(version: ModelVersion, final: dict) -> str:
    if final.get("ok"):
        version.status, version.error, version.progress, version.step = (
            ModelVersion.Status.READY, "", 1.0, "validated")
        version.validation = {k: final[k] for k in ("parameters", "context_length", "size_bytes",
                                                     "checksum", "dtype", "chat_template", "architecture",
                                                     "layers", "attention", "quantization") if k in final}
    else:
        version.status = ModelVersion.Status.FAILED
        version.error = str(final.get("error") or "validation failed")
        version.step = "failed"
    version.job_finished_at = timezone.now()
    version.save(update_fields=["status", "error", "progress", "step", "validation", "job_finished_at"])
    return version.status
