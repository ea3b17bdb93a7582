"""The console's batches page (staff only): every batch with its status, progress, duration and
links to its files, which staff download from here (the API serves them only to their owner)."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from webapp.batches.models import BatchFile
from webapp.batches.selectors import batch_list_for_console
from webapp.console.access import staff_required


def _row(batch) -> dict:
    started = batch.in_progress_at or batch.created_at
    ended = batch.completed_at or batch.cancelled_at or batch.failed_at or batch.expired_at
    seconds = ((ended or timezone.now()) - started).total_seconds()
    done = batch.num_completed + batch.num_failed
    return {"batch": batch, "done": done, "percent": round(100 * done / batch.num_total) if batch.num_total else 0,
            "duration_s": round(seconds, 1), "running": ended is None}


@never_cache
@staff_required
def batches_page(request):
    rows = [_row(b) for b in batch_list_for_console()]
    return render(request, "console/batches.html", {"page": "batches", "rows": rows})


@staff_required
def batch_file_download(request, file_id: str):
    file = get_object_or_404(BatchFile, public_id=file_id)
    with file.content.open("rb") as handle:
        response = HttpResponse(handle.read(), content_type="application/jsonl")
    response["Content-Disposition"] = f'attachment; filename="{file.filename}"'
    return response
