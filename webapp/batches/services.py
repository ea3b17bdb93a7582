"""Writes of the Batch API: upload and delete files, create and cancel batches.

A batch is queued as a background job (webapp/batches/tasks.py) once its row is committed; the
job validates its lines, runs them and writes the output and error files (webapp/batches/runner.py).
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from webapp.batches.conf import batch_setting
from webapp.batches.files import file_save
from webapp.batches.lines import LineError, read_lines
from webapp.batches.models import Batch, BatchFile
from webapp.batches.tasks import batch_run_task
from webapp.config.embedded_jobs import enqueue
from webapp.keys.models import ApiKey
from webapp.openai_api import errors

COMPLETION_WINDOW = timedelta(hours=24)


def file_create(*, api_key: ApiKey, filename: str, content: bytes, purpose: str = BatchFile.Purpose.BATCH
                ) -> BatchFile:
    """Store an input file whose every line is a valid request; OpenAIError (400 naming the line
    and field, 413 over the size limit) otherwise."""
    max_bytes = batch_setting("PAGODA_BATCH_MAX_FILE_BYTES")
    if len(content) > max_bytes:
        raise errors.OpenAIError(413, f"The file is {len(content)} bytes; at most {max_bytes} are accepted.",
                                 param="file", code="file_too_large")
    num_lines = 0
    if purpose == BatchFile.Purpose.BATCH:
        try:
            num_lines = len(read_lines(content, max_lines=batch_setting("PAGODA_BATCH_MAX_LINES")))
        except LineError as exc:
            raise exc.to_openai() from None
    return file_save(owner=api_key.owner, api_key=api_key, filename=filename, content=content, purpose=purpose,
                     num_lines=num_lines)


def file_delete(*, file: BatchFile) -> None:
    file.content.delete(save=False)
    file.delete()


def batch_create(*, api_key: ApiKey, input_file: BatchFile, endpoint: str, completion_window: str,
                 metadata: dict | None) -> Batch:
    """A new batch (status validating), queued to run once committed."""
    if input_file.purpose != BatchFile.Purpose.BATCH:
        raise errors.invalid_parameter("input_file_id", f"The file {input_file.public_id} has purpose "
                                                        f"{input_file.purpose!r}, not 'batch'.")
    with transaction.atomic():
        batch = Batch.objects.create(owner=api_key.owner, api_key=api_key, input_file=input_file,
                                     input_file_public_id=input_file.public_id, endpoint=endpoint,
                                     completion_window=completion_window, metadata=metadata,
                                     expires_at=timezone.now() + COMPLETION_WINDOW)
        transaction.on_commit(lambda: batch_enqueue(batch_id=batch.pk))
    return batch


def batch_enqueue(*, batch_id: int) -> None:
    enqueue(batch_run_task, batch_id)


def batch_cancel(*, batch: Batch) -> Batch:
    """Ask the runner to stop: cancelling now, cancelled once its running lines are aborted. A batch
    that has ended already is refused (409, as OpenAI does)."""
    now = timezone.now()
    if batch.status in (Batch.Status.CANCELLING, Batch.Status.CANCELLED):
        return batch
    updated = Batch.objects.filter(pk=batch.pk, status__in=[Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS]
                                   ).update(status=Batch.Status.CANCELLING, cancelling_at=now)
    batch.refresh_from_db()
    if not updated:
        raise errors.OpenAIError(409, f"Cannot cancel a batch with status {batch.status!r}.", param="batch_id",
                                 code="batch_not_cancellable")
    return batch
