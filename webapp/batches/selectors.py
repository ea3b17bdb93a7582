"""Reads of files and batches, always scoped to their owner: another user's id is not found."""

from __future__ import annotations

from webapp.batches.models import Batch, BatchFile
from webapp.openai_api import errors


def file_get(*, owner, public_id: str) -> BatchFile:
    file = BatchFile.objects.filter(owner=owner, public_id=public_id).first()
    if file is None:
        raise errors.OpenAIError(404, f"No such File object: {public_id}", param="file_id", code="file_not_found")
    return file


def file_list(*, owner, purpose: str | None = None, after: str | None = None, limit: int = 20
              ) -> tuple[list[BatchFile], bool]:
    files = BatchFile.objects.filter(owner=owner)
    if purpose:
        files = files.filter(purpose=purpose)
    return _page(files, BatchFile, owner, after, limit)


def batch_get(*, owner, public_id: str) -> Batch:
    batch = Batch.objects.select_related("output_file", "error_file").filter(owner=owner, public_id=public_id).first()
    if batch is None:
        raise errors.OpenAIError(404, f"No such Batch object: {public_id}", param="batch_id", code="batch_not_found")
    return batch


def batch_list(*, owner, after: str | None = None, limit: int = 20) -> tuple[list[Batch], bool]:
    batches = Batch.objects.select_related("output_file", "error_file").filter(owner=owner)
    return _page(batches, Batch, owner, after, limit)


def _page(queryset, model, owner, after, limit):
    """Newest first; ``after`` an id of the previous page: the page continues past it."""
    if after:
        anchor = model.objects.filter(owner=owner, public_id=after).values("id").first()
        if anchor is None:
            raise errors.invalid_parameter("after", f"No object with id {after!r}.")
        queryset = queryset.filter(id__lt=anchor["id"])
    rows = list(queryset.order_by("-id")[:limit + 1])
    return rows[:limit], len(rows) > limit


def batch_list_for_console(*, limit: int = 200) -> list[Batch]:
    return list(Batch.objects.select_related("owner", "api_key", "output_file", "error_file")
                .order_by("-id")[:limit])
