"""Storing a batch file: an upload checked by services.file_create, or a batch's output and error
files written when it ends (finalize.py)."""

from __future__ import annotations

from django.core.files.base import ContentFile

from webapp.batches.models import Batch, BatchFile


def file_save(*, owner, api_key, filename: str, content: bytes, purpose: str, num_lines: int) -> BatchFile:
    file = BatchFile(owner=owner, api_key=api_key, filename=filename[:255] or "file.jsonl", purpose=purpose,
                     num_bytes=len(content), num_lines=num_lines)
    file.content.save(f"{file.public_id}.jsonl", ContentFile(content), save=False)
    file.save()
    return file


def output_file_create(*, batch: Batch, name: str, content: bytes, num_lines: int) -> BatchFile:
    return file_save(owner=batch.owner, api_key=batch.api_key, filename=f"{batch.public_id}_{name}.jsonl",
                     content=content, purpose=BatchFile.Purpose.BATCH_OUTPUT, num_lines=num_lines)
