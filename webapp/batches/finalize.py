"""Ending a batch: its output file (lines answered 2xx) and error file (every other line), in the
input's order, then its final status: completed, cancelled or expired."""

from __future__ import annotations

import json

from django.utils import timezone

from webapp.batches.execution import output_line
from webapp.batches.files import output_file_create
from webapp.batches.models import Batch, BatchLine

NOT_RUN = {
    Batch.Status.CANCELLING: ("batch_cancelled", "The batch was cancelled before this request ran."),
    Batch.Status.IN_PROGRESS: ("batch_expired", "This request could not be executed before the completion "
                                                "window expired."),
}


def _jsonl(results: list[dict]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in results)


def batch_finalize(*, batch: Batch) -> Batch:
    """Write the files and end the batch. Lines that never ran (cancelled, expired) go to the error
    file with an ``error`` and no ``response``; they count as neither completed nor failed."""
    cancelling = batch.status == Batch.Status.CANCELLING or batch.cancelling_at is not None
    expired = not cancelling and batch.status != Batch.Status.FINALIZING and timezone.now() >= batch.expires_at
    if batch.status != Batch.Status.FINALIZING:
        Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.FINALIZING, finalizing_at=timezone.now())
    code, message = NOT_RUN[Batch.Status.CANCELLING if cancelling else Batch.Status.IN_PROGRESS]
    outputs, failures = [], []
    for line in batch.lines.order_by("line_number"):
        if line.status == BatchLine.Status.COMPLETED:
            outputs.append(line.result)
        elif line.status == BatchLine.Status.FAILED:
            failures.append(line.result)
        else:
            failures.append(output_line(line, status_code=None, request_id="", body=None,
                                        error={"code": code, "message": message}))
    fields: dict = {}
    if outputs and batch.output_file_id is None:
        fields["output_file"] = output_file_create(batch=batch, name="output", content=_jsonl(outputs),
                                                   num_lines=len(outputs))
    if failures and batch.error_file_id is None:
        fields["error_file"] = output_file_create(batch=batch, name="error", content=_jsonl(failures),
                                                  num_lines=len(failures))
    now = timezone.now()
    if cancelling:
        fields.update(status=Batch.Status.CANCELLED, cancelled_at=now)
    elif expired:
        fields.update(status=Batch.Status.EXPIRED, expired_at=now)
    else:
        fields.update(status=Batch.Status.COMPLETED, completed_at=now)
    Batch.objects.filter(pk=batch.pk).update(runner_id="", **fields)
    batch.refresh_from_db()
    return batch
