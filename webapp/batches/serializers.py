"""The File and Batch objects in OpenAI's shapes (openai.types.FileObject and openai.types.Batch),
and the request bodies of the Batch API's writes."""

from __future__ import annotations

from rest_framework import serializers

from webapp.batches.lines import ENDPOINTS
from webapp.batches.models import Batch, BatchFile

COMPLETION_WINDOWS = ["24h"]
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def _ts(value) -> int | None:
    return int(value.timestamp()) if value is not None else None


def file_object(file: BatchFile) -> dict:
    return {"id": file.public_id, "object": "file", "bytes": file.num_bytes, "created_at": _ts(file.created_at),
            "filename": file.filename, "purpose": file.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def batch_object(batch: Batch) -> dict:
    errors = None
    if batch.errors:
        errors = {"object": "list", "data": [{"code": e.get("code"), "message": e.get("message"),
                                              "param": e.get("param"), "line": e.get("line")} for e in batch.errors]}
    return {
        "id": batch.public_id, "object": "batch", "endpoint": batch.endpoint, "model": batch.model_name or None,
        "errors": errors, "input_file_id": batch.input_file_public_id,
        "completion_window": batch.completion_window, "status": batch.status,
        "output_file_id": batch.output_file.public_id if batch.output_file else None,
        "error_file_id": batch.error_file.public_id if batch.error_file else None,
        "created_at": _ts(batch.created_at), "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at), "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at), "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at), "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {"total": batch.num_total, "completed": batch.num_completed, "failed": batch.num_failed},
        "usage": {"input_tokens": batch.input_tokens, "output_tokens": batch.output_tokens,
                  "total_tokens": batch.input_tokens + batch.output_tokens,
                  "input_tokens_details": {"cached_tokens": batch.cached_tokens},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "metadata": batch.metadata,
    }


def list_page(objects: list[dict], *, has_more: bool) -> dict:
    return {"object": "list", "data": objects, "first_id": objects[0]["id"] if objects else None,
            "last_id": objects[-1]["id"] if objects else None, "has_more": has_more}


class MetadataField(serializers.Field):
    default_error_messages = {
        "invalid": f"must be an object of at most {MAX_METADATA_PAIRS} string pairs (keys up to "
                   f"{MAX_METADATA_KEY} characters, values up to {MAX_METADATA_VALUE})"}

    def to_internal_value(self, data) -> dict:
        if not (isinstance(data, dict) and len(data) <= MAX_METADATA_PAIRS
                and all(isinstance(k, str) and len(k) <= MAX_METADATA_KEY and isinstance(v, str)
                        and len(v) <= MAX_METADATA_VALUE for k, v in data.items())):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class FileUploadSerializer(serializers.Serializer):
    purpose = serializers.ChoiceField(choices=["batch"], error_messages={
        "invalid_choice": "only \"batch\" files are accepted here"})
    file = serializers.FileField(allow_empty_file=False)


class BatchCreateSerializer(serializers.Serializer):
    input_file_id = serializers.CharField(max_length=40)
    endpoint = serializers.ChoiceField(choices=list(ENDPOINTS), error_messages={
        "invalid_choice": f"must be one of {', '.join(ENDPOINTS)}"})
    completion_window = serializers.ChoiceField(choices=COMPLETION_WINDOWS, error_messages={
        "invalid_choice": "must be \"24h\""})
    metadata = MetadataField(required=False, allow_null=True)


class PageSerializer(serializers.Serializer):
    """GET v1/batches: OpenAI's 1..100 (default 20)."""

    after = serializers.CharField(required=False, max_length=40)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)


class FilePageSerializer(PageSerializer):
    """GET v1/files: OpenAI's 1..10,000 (default 10,000)."""

    limit = serializers.IntegerField(required=False, min_value=1, max_value=10_000, default=10_000)
