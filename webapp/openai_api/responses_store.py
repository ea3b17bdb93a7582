"""The stored responses of the Responses API: kept when a response ends (``store``), read back for
``previous_response_id`` and ``GET``, deleted, and the state of a ``background`` one.

Every read is by the key's owner: another owner's response answers exactly as an unknown id does.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.models import StoredResponse
from webapp.openai_api.responses_input import stored_conversation
from webapp.openai_api.responses_render import output_conversation
from webapp.openai_api.services import Generation

RUNNING = (StoredResponse.Status.QUEUED, StoredResponse.Status.IN_PROGRESS)  # a background response's


def not_found(response_id: str) -> errors.OpenAIError:
    return errors.OpenAIError(404, f"Response with id '{response_id}' not found.", param="response_id",
                              code="response_not_found")


def response_get(*, api_key: ApiKey, response_id: str) -> StoredResponse:
    stored = StoredResponse.objects.filter(response_id=response_id, owner_id=api_key.owner_id).first()
    if stored is None:
        raise not_found(response_id)
    return stored


def response_delete(*, api_key: ApiKey, response_id: str) -> dict:
    response_get(api_key=api_key, response_id=response_id).delete()
    return {"id": response_id, "object": "response", "deleted": True}


def response_keep(gen: Generation, body: dict) -> None:
    """Store a finished response (unless ``store`` is false), with the conversation it ends."""
    values = gen.values
    if not values["response"]["store"]:
        return
    text, calls = output_conversation(body["output"])
    fields = dict(owner_id=gen.api_key.owner_id, status=body["status"], body=body,
                  messages=stored_conversation(values, text, calls))
    if values["response"]["background"]:  # its row was queued; deleted or cancelled meanwhile, it stays so
        StoredResponse.objects.filter(response_id=gen.request_id, status__in=RUNNING).update(
            **fields, updated_at=timezone.now())
    else:
        StoredResponse.objects.update_or_create(response_id=gen.request_id, defaults=fields)


def response_queue(*, api_key: ApiKey, body: dict) -> None:
    """A background response, stored as queued before it runs."""
    StoredResponse.objects.create(response_id=body["id"], owner_id=api_key.owner_id, status=body["status"],
                                  body=body)


@transaction.atomic
def response_start(*, response_id: str) -> None:
    """A queued background response whose generation starts: ``in_progress`` (unless cancelled meanwhile)."""
    stored = StoredResponse.objects.select_for_update().filter(
        response_id=response_id, status=StoredResponse.Status.QUEUED).first()
    if stored is not None:
        stored.status = StoredResponse.Status.IN_PROGRESS
        stored.body = {**stored.body, "status": stored.status}
        stored.save(update_fields=["status", "body", "updated_at"])


@transaction.atomic
def response_end(*, response_id: str, status: str, error: dict | None = None) -> None:
    """A background response that ended without an answer (failed, cancelled), unless it has one."""
    stored = StoredResponse.objects.select_for_update().filter(response_id=response_id).first()
    if stored is None or stored.status not in RUNNING:
        return
    stored.status = status
    stored.body = {**stored.body, "status": status, "error": error}
    stored.save(update_fields=["status", "body", "updated_at"])
