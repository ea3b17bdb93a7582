"""Running one completion request on the event loop: collect it, or stream it as SSE.

The ORM work (authentication, validation, usage) runs through ``sync_to_async``; the engine is
reached through workers.transport's EngineClient, whose iterator aborts the request in the
engine when it is closed early. Both paths close it on every way out (``aclosing``), so a client
that goes away (Django cancels the view task, or closes the streaming iterator) aborts its
generation and the usage record says "aborted".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from webapp.keys.enforcement import apikey_release
from webapp.openai_api import errors
from webapp.openai_api.responses import DONE, StreamFormatter, completion_body, sse
from webapp.openai_api.services import (Generation, Outcome, api_key_from_header, generation_admit,
                                        generation_finish, generation_prepare, new_request_id,
                                        request_refused)
from workers.protocol import Chunk
from workers.transport import get_engine_client

logger = logging.getLogger(__name__)
TOO_BIG = object()  # marks a body over DATA_UPLOAD_MAX_MEMORY_SIZE


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
        await sync_to_async(generation_admit)(api_key=api_key, request_id=request_id)
        gen = await sync_to_async(generation_prepare)(request_id=request_id, endpoint=endpoint, api_key=api_key,
                                                      data=data, started=started)
    except errors.OpenAIError as exc:
        await sync_to_async(request_refused)(request_id=request_id, endpoint=endpoint, api_key=api_key,
                                             data=data, error=exc, started=started)
        return exc.response()
    except Exception as exc:  # e.g. a tokenizer export gone missing: still an OpenAI error object
        await sync_to_async(apikey_release)(api_key=api_key, request_id=request_id)
        return _internal_error(exc).response()
    chunks = get_engine_client().generate(gen.engine_request())
    response = await (_stream(gen, chunks) if gen.stream else _complete(gen, chunks))
    response["X-Request-Id"] = request_id
    return response


async def _finish(gen: Generation, outcome: Outcome, *, aborted: bool = False,
                  error: errors.OpenAIError | None = None) -> None:
    await sync_to_async(generation_finish)(generation=gen, outcome=outcome, aborted=aborted, error=error)


async def _complete(gen: Generation, chunks: AsyncIterator[Chunk]) -> HttpResponse:
    outcome = Outcome()
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


async def _stream(gen: Generation, chunks: AsyncIterator[Chunk]) -> HttpResponse:
    """Wait for the first chunk so that a refusal still gets its HTTP status, then stream."""
    outcome = Outcome()
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
    completed = False
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
        if error is not None:
            yield sse(error.to_dict())  # the openai client raises APIError on an "error" event
        elif usage := formatter.usage(outcome):
            yield usage
        yield DONE
        completed = True
    except Exception as exc:  # not CancelledError/GeneratorExit: those are the client leaving
        error = _internal_error(exc)
        yield sse(error.to_dict())
        completed = True
    finally:
        await _finish(gen, outcome, aborted=not completed and not outcome.finished, error=error)
