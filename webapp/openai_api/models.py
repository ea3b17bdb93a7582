"""Stored responses of the Responses API (``store``, ``previous_response_id``, ``background``).

A response belongs to the owner of the key that created it: any of that owner's keys may read,
continue or delete it; for anyone else it does not exist (404, the same answer as an unknown id).
"""

from django.conf import settings
from django.db import models as m
from django.utils import timezone


class StoredResponse(m.Model):
    class Status(m.TextChoices):
        QUEUED = "queued"
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        INCOMPLETE = "incomplete"
        FAILED = "failed"
        CANCELLED = "cancelled"

    response_id = m.CharField(max_length=64, unique=True)
    owner = m.ForeignKey(settings.AUTH_USER_MODEL, on_delete=m.CASCADE, related_name="stored_responses")
    status = m.CharField(max_length=16, choices=Status.choices)
    body = m.JSONField()  # the Response object as the API answers it
    # The conversation up to and including this response's output, as chat messages (the
    # internal request's shape), without its instructions: what previous_response_id continues.
    messages = m.JSONField(default=list)
    created_at = m.DateTimeField(default=timezone.now, db_index=True)
    updated_at = m.DateTimeField(auto_now=True)

    class Meta:
        indexes = [m.Index(fields=["owner", "created_at"])]

    def __str__(self) -> str:
        return self.response_id
