"""A completion request's life around its generation: the key check, admission, the shutdown drain's
list, and the usage record of a request that never reaches the engine.

The key is checked first (401, no usage record). From then on the request is listed with
config.shutdown's ``track`` until exactly one usage record is written: by generation_respond once
the request reaches the engine, else here, whatever ends it: a refusal (a bad body, a limit, the
server shutting down, the view's InputSerializer, an unknown model), a failure of ours, or the
client hanging up (Django cancels the view's task) while the body is checked, the request admitted
or tokenized. A refusal leaves as an OpenAI error object whose X-Request-Id names its usage
record. Writing the record releases what admission took (the key's concurrency slot).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from rest_framework.exceptions import ValidationError

from webapp.config.shutdown import shutting_down, track, tracked, untrack
from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.body import body_parse
from webapp.openai_api.generation import generation_respond
from webapp.openai_api.services import (api_key_from_header, generation_admit, new_request_id,
                                        request_refused_record)
from webapp.usage.group_commit import usage_record_save


@dataclass
class _Call:
    """A request between its key check and its usage record."""

    request_id: str
    endpoint: str
    api_key: ApiKey
    started: float  # time.monotonic() when the request arrived
    body: object = None  # the JSON body, once parsed


async def completion_create(*, request: HttpRequest, endpoint: str, validate: Callable[[object], dict],
                            respond: Callable[..., Awaitable[HttpResponse]] = generation_respond) -> HttpResponse:
    """Answer a completion request: ``validate`` turns its admitted JSON body into the values of the
    view's InputSerializer (ValidationError if it cannot), ``respond`` runs it (the embeddings view
    passes its own); every refusal is an OpenAI error object."""
    started, request_id = time.monotonic(), new_request_id(endpoint)
    try:
        api_key = await sync_to_async(api_key_from_header)(request.headers.get("Authorization"))
    except errors.OpenAIError as exc:
        return exc.response()
    call = _Call(request_id=request_id, endpoint=endpoint, api_key=api_key, started=started)
    track(request_id, asyncio.current_task(), cut=lambda: _account(call, None))
    try:
        await _admit(call, request)
        return await respond(request_id=request_id, endpoint=endpoint, api_key=api_key,
                             values=validate(call.body), started=started)
    except (errors.OpenAIError, ValidationError) as exc:
        error = errors.from_validation_error(exc) if isinstance(exc, ValidationError) else exc
    except asyncio.CancelledError:  # the client went away (or the server is shutting down)
        await _account(call, None)
        raise
    except Exception as exc:  # e.g. a tokenizer export gone missing: still an OpenAI error object
        error = errors.internal_error(exc)
    await _account(call, error)
    response = error.response()
    response["X-Request-Id"] = request_id  # names its usage record
    return response


async def _admit(call: _Call, request: HttpRequest) -> None:
    """Parse the body into ``call.body`` and let the key's limits admit the request; OpenAIError if not.
    (Load past this process's capacity was refused before Django: webapp/config/gate.py.)"""
    call.body = body_parse(request)
    if shutting_down():
        raise errors.server_shutting_down()
    await sync_to_async(generation_admit)(api_key=call.api_key, request_id=call.request_id)


async def _account(call: _Call, error: errors.OpenAIError | None) -> None:
    """Write the usage record of a request that did not reach the engine (``error`` None: the
    client left), unless one is written already: a generation records its own."""
    entry = tracked(call.request_id)
    if entry is None or entry.finishing:
        return
    entry.finishing = True
    try:  # cancelled again meanwhile, the thread still builds the record and the group commit saves it
        record = await sync_to_async(request_refused_record)(
            request_id=call.request_id, endpoint=call.endpoint, api_key=call.api_key, data=call.body,
            error=error, started=call.started)
        if record is not None:  # None: its running record was ended instead
            await usage_record_save(record)
    finally:
        untrack(call.request_id, entry)
