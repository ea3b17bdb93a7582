"""A generation request's life around its generation, whatever its API: the key check, admission, the shutdown drain's
list, and the usage record of a request that never reaches the engine.

The key is checked first (401, no usage record). From then on the request is listed with
config.shutdown's ``track`` until exactly one usage record is written: by generation_respond once
the request reaches the engine, else here, whatever ends it: a refusal (a bad body, a limit, the
server shutting down, the view's InputSerializer, an unknown model), a failure of ours, or the
client hanging up (Django cancels the view's task) while the body is checked, the request admitted
or tokenized. A refusal leaves as an error object in the API's own shape (its ``Dialect``) whose
X-Request-Id names its usage record. Writing the record releases what admission took (the key's concurrency slot).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from rest_framework.exceptions import ValidationError

from webapp.config.shutdown import shutting_down, track, tracked, untrack
from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.body import body_parse
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.generation import generation_respond
from webapp.openai_api.services import generation_admit, new_request_id, request_refused_record
from webapp.openai_api.timing import phases_begin
from webapp.usage.group_commit import usage_record_save


@dataclass
class _Call:
    """A request between its key check and its usage record."""

    request_id: str
    endpoint: str
    api_key: ApiKey
    started: float  # time.monotonic() when the request arrived
    body: object = None  # the JSON body, once parsed


async def completion_create(*, request: HttpRequest, dialect: Dialect, request_id: str | None = None) -> HttpResponse:
    """Answer a generation request of ``dialect``'s API: its ``validate`` turns the admitted JSON
    body into the internal request (ValidationError if it cannot); every refusal is an error object
    in the API's shape. ``request_id``: one named beforehand (a background response's)."""
    endpoint = dialect.endpoint
    started, request_id = time.monotonic(), request_id or new_request_id(endpoint)
    phases = phases_begin(request, started)
    try:
        api_key = await sync_to_async(dialect.key)(request)
    except errors.OpenAIError as exc:
        return dialect.error_response(exc)
    phases.mark("key")
    call = _Call(request_id=request_id, endpoint=endpoint, api_key=api_key, started=started)
    track(request_id, asyncio.current_task(), cut=lambda: _account(call, None))

    async def admitted() -> HttpResponse:
        await _admit(call, request)
        phases.mark("admit")
        respond = dialect.respond or generation_respond
        return await respond(request_id=request_id, dialect=dialect, api_key=api_key,
                             values=dialect.validate(call.body), started=started)

    response = await _answered(call, dialect, admitted())
    if "prepare" in phases.names():  # it reached the engine: until the response began
        phases.mark("engine")
    response["Server-Timing"] = phases.header()  # a stream's headers are not sent yet
    return response


async def completion_continue(*, request_id: str, dialect: Dialect, api_key: ApiKey, values: dict,
                              started: float) -> HttpResponse:
    """Generate, in a task of its own, a request that ``completion_create`` admitted and validated
    and whose ``respond`` answered without generating (a background response): the same single
    usage record, the key's slot held until it is written, the drain cancelling this task now."""
    call = _Call(request_id=request_id, endpoint=dialect.endpoint, api_key=api_key, started=started, body=values)
    track(request_id, asyncio.current_task(), cut=lambda: _account(call, None))
    return await _answered(call, dialect, generation_respond(request_id=request_id, dialect=dialect,
                                                             api_key=api_key, values=values, started=started))


async def completion_abandon(request_id: str) -> None:
    """An admitted request whose generation never began (a background response cancelled while
    queued): its usage record, aborted and not billed, written now as a hang-up's would be, and
    the key's slot freed. A no-op once the request has its record (a generation writes its own)."""
    entry = tracked(request_id)
    if entry is not None and entry.cut is not None:
        await entry.cut()


async def _answered(call: _Call, dialect: Dialect, work: Awaitable[HttpResponse]) -> HttpResponse:
    """``work``'s response, or the error object of its refusal with the usage record written."""
    try:
        return await work
    except (errors.OpenAIError, ValidationError) as exc:
        error = errors.from_validation_error(exc) if isinstance(exc, ValidationError) else exc
    except asyncio.CancelledError:  # the client went away (or the server is shutting down)
        await _account(call, None)
        raise
    except Exception as exc:  # e.g. a tokenizer export gone missing: still an OpenAI error object
        error = errors.internal_error(exc)
    await _account(call, error)
    response = dialect.error_response(error)
    response["X-Request-Id"] = call.request_id  # names its usage record
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
