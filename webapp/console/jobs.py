"""The console's jobs page: every background job, newest first, with live progress.

Two kinds today: a model version's validation (with its dtype conversion first, when the upload
asked for one; registry.tasks.validate_model_version) and a Batch API batch (webapp.batches).
Each becomes one row of the same shape, for the page and for ``jobs.json`` that it polls.
"""

from __future__ import annotations

from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache

from webapp.batches.selectors import batch_list_for_console
from webapp.console.access import staff_required
from webapp.registry.models import ModelVersion

MAX_ROWS = 200
_VALIDATION_STATE = {  # ModelVersion.status -> the job's state
    ModelVersion.Status.VALIDATING: "running", ModelVersion.Status.FAILED: "failed",
}
_BATCH_STATE = {"validating": "queued", "in_progress": "running", "finalizing": "running", "cancelling": "running",
                "completed": "done", "failed": "failed", "expired": "failed", "cancelled": "cancelled"}


def _seconds(started, finished) -> float | None:
    if started is None:
        return None
    return round(((finished or timezone.now()) - started).total_seconds(), 1)


def _shown(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")


def _validation_row(version: ModelVersion) -> dict:
    converting = (version.validation or {}).get("convert_dtype")
    state = _VALIDATION_STATE.get(version.status, "done")
    return {
        "id": f"validation-{version.pk}", "kind": "conversion + validation" if converting else "validation",
        "subject": f"{version.model.slug} v{version.number}", "state": state, "step": version.step or version.status,
        "progress": round(100 * (1.0 if state == "done" else version.progress)),
        "created_at": version.created_at.isoformat(), "created": _shown(version.created_at),
        "duration_s": _seconds(version.job_started_at, version.job_finished_at),
        "result": version.error if state == "failed" else ("ready" if state == "done" else ""),
        "link": reverse("console:models"),
    }


def _batch_row(batch) -> dict:
    done = batch.num_completed + batch.num_failed
    ended = batch.completed_at or batch.cancelled_at or batch.failed_at or batch.expired_at
    state = _BATCH_STATE.get(batch.status, batch.status)
    result = f"{batch.num_completed} ok, {batch.num_failed} failed" if state != "queued" else ""
    return {
        "id": f"batch-{batch.public_id}", "kind": "batch", "subject": f"{batch.public_id} ({batch.endpoint})",
        "state": state, "step": batch.status, "progress": round(100 * done / batch.num_total) if batch.num_total else 0,
        "created_at": batch.created_at.isoformat(), "created": _shown(batch.created_at),
        "duration_s": _seconds(batch.in_progress_at, ended),
        "result": result, "link": reverse("console-batches"),
    }


def job_rows() -> list[dict]:
    """Validations of uploads and batches, newest first (MAX_ROWS of them)."""
    versions = (ModelVersion.objects.select_related("model").filter(is_uploaded=True)
                .order_by("-created_at")[:MAX_ROWS])
    rows = [_validation_row(v) for v in versions] + [_batch_row(b) for b in batch_list_for_console(limit=MAX_ROWS)]
    rows.sort(key=lambda r: r["created_at"], reverse=True)
    return rows[:MAX_ROWS]


@never_cache
@staff_required
def jobs_page(request):
    return render(request, "console/jobs.html", {"page": "jobs", "rows": job_rows()})


@never_cache
@staff_required
def jobs_json(request):
    return JsonResponse({"jobs": job_rows()})
