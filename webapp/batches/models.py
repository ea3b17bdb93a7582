"""Uploaded files, batches and the lines of a batch, each line's result kept as it ends.

A batch's lines are rows (not only a file) so that a restart finds which ones ran: a line is
pending, running (sent to the engine), or done with its output line in ``result``. The output
and error files are written from the rows when the batch ends, in the input's order.
"""

import uuid

from django.conf import settings
from django.db import models

from webapp.keys.models import ApiKey


def _file_id() -> str:
    return "file-" + uuid.uuid4().hex[:24]


def _batch_id() -> str:
    return "batch_" + uuid.uuid4().hex[:24]


class BatchFile(models.Model):
    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    public_id = models.CharField(max_length=40, unique=True, default=_file_id)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batch_files")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    content = models.FileField(upload_to="batch_files/")
    num_bytes = models.PositiveBigIntegerField()
    num_lines = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.public_id} {self.filename}"


class Batch(models.Model):
    class Status(models.TextChoices):
        VALIDATING = "validating"
        FAILED = "failed"
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    UNFINISHED = (Status.VALIDATING, Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)

    public_id = models.CharField(max_length=40, unique=True, default=_batch_id)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batches")
    # The key whose limits and usage the lines run under; a batch whose key is revoked fails its lines.
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="batches")
    input_file = models.ForeignKey(BatchFile, on_delete=models.SET_NULL, null=True, related_name="+")
    input_file_public_id = models.CharField(max_length=40)  # kept if the file is deleted
    output_file = models.ForeignKey(BatchFile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    error_file = models.ForeignKey(BatchFile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    endpoint = models.CharField(max_length=64)
    model_name = models.CharField(max_length=200, blank=True)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    errors = models.JSONField(null=True, blank=True)  # [{"code", "message", "param", "line"}]
    num_total = models.PositiveIntegerField(default=0)
    num_completed = models.PositiveIntegerField(default=0)
    num_failed = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Who runs it now: a runner claims the batch and beats; a stale beat lets another take over.
    runner_id = models.CharField(max_length=64, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    num_resumes = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return f"{self.public_id} {self.status}"


class BatchLine(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        COMPLETED = "completed"  # a 2xx response: the output file
        FAILED = "failed"  # an error response or no response: the error file

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    line_number = models.PositiveIntegerField()  # 1-based, in the input file
    custom_id = models.CharField(max_length=512)
    url = models.CharField(max_length=64)
    body = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    request_id = models.CharField(max_length=64, blank=True)  # names the line's usage record
    num_attempts = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)  # the output or error file's line

    class Meta:
        ordering = ["line_number"]
        constraints = [models.UniqueConstraint(fields=["batch", "line_number"], name="batch_line_number_unique"),
                       models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_line_custom_id_unique")]
        indexes = [models.Index(fields=["batch", "status"])]
