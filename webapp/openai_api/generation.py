"""Running one completion request on the event loop: collect it, or stream it as SSE.

The ORM work (authentication, validation, usage) runs through ``sync_to_async``; the engine is
reached through workers.connect's EngineClient, whose iterator aborts the request in the
engine when it is closed early. Both paths close it on every way out (``aclosing``), so a client
that goes away (Django cancels the view task, or closes the streaming iterator) aborts its
generation and the usage record says "aborted".

Every accepted request is listed in ``_running`` until its usage is recorded, so that a server
shutting down can drain them (``generations_drain``): no usage record goes missing with the
process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from webapp.keys.enforcement import apikey_release
from webapp.openai_api import errors
from webapp.openai_api.responses import DONE, StreamFormatter, completion_body, sse
from webapp.openai_api.services import (Generation, Outcome, api_key_from_header, generation_admit,
                                        generation_finish, generation_prepare, new_request_id,
                                        request_refused)
from workers.connect import get_engine_client
from workers.protocol import Chunk

logger = logging.getLogger(__name__)
TOO_BIG = object()  # marks a body over DATA_UPLOAD_MAX_MEMORY_SIZE
CANCEL_GRACE_S = 5.0  # after cancelling a request's task, how long it gets to record its usage


@dataclass
class _Running:
    """An accepted request whose usage is not recorded yet, and the task now running it."""

    gen: Generation
    outcome: Outcome
    task: asyncio.Task | None
    finishing: bool = False  # its usage record is being written


_running: dict[str, _Running] = {}  # request id -> entry; only touched on the event loop
_draining = False


def is_draining() -> bool:
    return _draining


def _internal_error(exc: Exception) -> errors.OpenAIError:
    logger.exception("generation failed", exc_info=exc)
    return errors.OpenAIError(500, "The server had an error while processing your request.",
                              type="server_error", code="internal_error")


async def respond(request: HttpRequest, endpoint: str) -> HttpResponse:
    started = time.monotonic()
    request_id = new_request_id(endpoint)
    try:
        api_key = await sync_to_async(api_key_from_header)(request.headers.get("Authorization"))
    except errors.OpenAIError as exc:
        return exc.response()
    try:
        data = json.loads(request.body)
    except RequestDataTooBig:
        data = TOO_BIG
    except ValueError:
        data = None
    try:
        if data is TOO_BIG:
            raise errors.OpenAIError(413, "The request body is too large.", code="request_too_large")
        if data is None:
            raise errors.invalid_parameter(None, "We could not parse the JSON body of your request.")
        if _draining:
            raise errors.OpenAIError(503, "The server is shutting down; try again shortly.", type="server_error",
                                     code="server_shutting_down")
        await sync_to_async(generation_admit)(api_key=api_key, request_id=request_id)
        gen = await sync_to_async(generation_prepare)(request_id=request_id, endpoint=endpoint, api_key=api_key,
                                                      data=data, started=started)
    except errors.OpenAIError as exc:
        await sync_to_async(request_refused)(request_id=request_id, endpoint=endpoint, api_key=api_key,
                                             data=data, error=exc, started=started)
        response = exc.response()
        response["X-Request-Id"] = request_id  # names its usage record
        return response
    except Exception as exc:  # e.g. a tokenizer export gone missing: still an OpenAI error object
        await sync_to_async(apikey_release)(api_key=api_key, request_id=request_id)
        return _internal_error(exc).response()
    outcome = Outcome()
    _running[request_id] = _Running(gen, outcome, asyncio.current_task())
    chunks = get_engine_client(settings.REDIS_URL).generate(gen.engine_request())
    response = await (_stream(gen, chunks, outcome) if gen.stream else _complete(gen, chunks, outcome))
    response["X-Request-Id"] = request_id
    return response


async def _finish(gen: Generation, outcome: Outcome, *, aborted: bool = False,
                  error: errors.OpenAIError | None = None) -> None:
    """Record the usage, once: a request drained at shutdown may be finished from two sides."""
    running = _running.get(gen.request_id)
    if running is None or running.finishing:
        return
    running.finishing = True
    try:
        await sync_to_async(generation_finish)(generation=gen, outcome=outcome, aborted=aborted, error=error)
    finally:
        _running.pop(gen.request_id, None)


async def generations_drain(timeout_s: float) -> int:
    """Shutting down: refuse new requests, give the running ones ``timeout_s`` to end, then end
    the rest as aborted (their generation aborted in the engine too). Returns how many were cut.

    Cancelling a request's task makes it record its own usage (and abort its generation) as a
    client going away does; one that does not within CANCEL_GRACE_S (a stream cancelled between
    two events leaves its iterator suspended) is aborted and recorded from here.
    """
    global _draining
    _draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while _running and loop.time() < deadline:
        await asyncio.sleep(0.05)
    cut = list(_running.values())
    if cut:
        logger.warning("shutting down: aborting %d requests still running after %.1f s", len(cut), timeout_s)
    for entry in cut:
        if entry.task is not None and not entry.task.done() and not entry.finishing:
            entry.task.cancel()
    deadline = loop.time() + CANCEL_GRACE_S
    while _running and loop.time() < deadline:
        await asyncio.sleep(0.05)
    for entry in [e for e in _running.values() if not e.finishing]:
        try:
            await get_engine_client(settings.REDIS_URL).abort(entry.gen.model.slug, entry.gen.request_id)
        except Exception:
            logger.warning("could not abort request %s", entry.gen.request_id, exc_info=True)
        await _finish(entry.gen, entry.outcome, aborted=True)
    return len(cut)


async def _complete(gen: Generation, chunks: AsyncIterator[Chunk], outcome: Outcome) -> HttpResponse:
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                outcome.add(chunk)
    except asyncio.CancelledError:  # the client went away; aclosing aborted the request
        await _finish(gen, outcome, aborted=True)
        raise
    except Exception as exc:
        error = _internal_error(exc)
        await _finish(gen, outcome, error=error)
        return error.response()
    if outcome.error is not None:
        error = errors.from_error_info(outcome.error, prompt_param=gen.prompt_param)
        await _finish(gen, outcome, error=error)
        return error.response()
    await _finish(gen, outcome)
    return JsonResponse(completion_body(gen, outcome))


async def _stream(gen: Generation, chunks: AsyncIterator[Chunk], outcome: Outcome) -> HttpResponse:
    """Wait for the first chunk so that a refusal still gets its HTTP status, then stream."""
    try:
        first = await anext(chunks)
    except asyncio.CancelledError:
        await chunks.aclose()
        await _finish(gen, outcome, aborted=True)
        raise
    except Exception as exc:
        await chunks.aclose()
        error = _internal_error(exc)
        await _finish(gen, outcome, error=error)
        return error.response()
    outcome.add(first)
    if first.error is not None:
        await chunks.aclose()
        error = errors.from_error_info(first.error, prompt_param=gen.prompt_param)
        await _finish(gen, outcome, error=error)
        return error.response()
    response = StreamingHttpResponse(_events(gen, chunks, first, outcome), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # proxies must pass each event on at once
    return response


async def _events(gen: Generation, chunks: AsyncIterator[Chunk], first: Chunk, outcome: Outcome):
    formatter = StreamFormatter(gen)
    error: errors.OpenAIError | None = None
    if (running := _running.get(gen.request_id)) is not None:
        running.task = asyncio.current_task()  # the server's task sending the response now
    try:
        async with aclosing(chunks):
            for part in (formatter.start(), formatter.delta(first.text, first.logprobs,
                                                           first.finish_reason if first.finished else None)):
                if part:
                    yield part
            if not first.finished:
                async for chunk in chunks:
                    outcome.add(chunk)
                    if chunk.error is not None:
                        error = errors.from_error_info(chunk.error, prompt_param=gen.prompt_param)
                        break
                    part = formatter.delta(chunk.text, chunk.logprobs, chunk.finish_reason if chunk.finished else None)
                    if part:
                        yield part
        # Recorded before the last events: a client that has read [DONE] finds its usage, and one
        # that hangs up right after it (the openai client does) cannot leave it unwritten.
        await _finish(gen, outcome, error=error)
        if error is not None:
            yield sse(error.to_dict())  # the openai client raises APIError on an "error" event
        elif usage := formatter.usage(outcome):
            yield usage
        yield DONE
    except Exception as exc:  # not CancelledError/GeneratorExit: those are the client leaving
        error = _internal_error(exc)
        await _finish(gen, outcome, error=error)
        yield sse(error.to_dict())
    finally:  # the client left mid-stream (a no-op when the usage is recorded already)
        await _finish(gen, outcome, aborted=not outcome.finished, error=error)
