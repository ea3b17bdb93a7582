"""Running one accepted generation request on the event loop, whatever its API: collect it, or
stream it as SSE, its answer rendered by the API's ``Dialect`` (webapp/openai_api/dialect.py) from
the one internal event stream (webapp/openai_api/events.py).

The ORM work (model lookup, tokenizing, usage) runs through ``sync_to_async``; the engine is
reached through workers.connect's EngineClient (webapp/openai_api/prompts.py: one engine request
per prompt of a completion's list), whose iterator aborts the request in the engine when it is
closed early. Both paths close it on every way out (``aclosing``), so a client
that goes away (Django cancels the view task, or closes the streaming iterator) aborts its
generation and the usage record says "aborted".

Every accepted request is listed with config.shutdown's ``track`` until its usage is recorded,
so that a server shutting down drains it (and ends it with ``_cut`` if cancelling does not):
no usage record goes missing with the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from webapp.config.shutdown import track, tracked, untrack
from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.events import ChunkEvents
from webapp.openai_api.prompts import generation_abort, generation_chunks
from webapp.openai_api.services import Generation, generation_finish, generation_prepare
from webapp.openai_api.timing import phase_mark
from webapp.usage.checkpoints import get_checkpoints
from webapp.usage.outcome import Outcome
from workers.protocol import Chunk

logger = logging.getLogger(__name__)


def _prepare(dialect: Dialect, request_id: str, api_key: ApiKey, values: dict, started: float) -> Generation:
    if dialect.resolve is not None:
        values = dialect.resolve(api_key=api_key, values=values)
    return generation_prepare(request_id=request_id, endpoint=dialect.endpoint, api_key=api_key, values=values,
                              started=started)


async def generation_respond(*, request_id: str, dialect: Dialect, api_key: ApiKey, values: dict,
                             started: float) -> HttpResponse:
    """Run an admitted request whose body the dialect validated; OpenAIError if it is refused
    before reaching a worker (unknown model, template refusal), a response otherwise."""
    gen = await sync_to_async(_prepare)(dialect, request_id, api_key, values, started)
    phase_mark("prepare")
    outcome = Outcome()
    get_checkpoints().watch(request_id, outcome, started)  # until _finish
    chunks = generation_chunks(gen)  # a list of prompts: its prompts' engine requests merged
    track(request_id, asyncio.current_task(), cut=lambda: _cut(gen, outcome))
    response = await (_stream(dialect, gen, chunks, outcome) if gen.stream
                      else _complete(dialect, gen, chunks, outcome))
    response["X-Request-Id"] = request_id
    return response


async def _finish(gen: Generation, outcome: Outcome, *, aborted: bool = False,
                  error: errors.OpenAIError | None = None) -> None:
    """Record the usage, once: a request drained at shutdown may be finished from two sides."""
    running = tracked(gen.request_id)
    if running is None or running.finishing:
        return
    running.finishing = True
    try:
        await sync_to_async(generation_finish)(generation=gen, outcome=outcome, aborted=aborted, error=error)
    finally:
        get_checkpoints().unwatch(gen.request_id)
        untrack(gen.request_id)


async def _cut(gen: Generation, outcome: Outcome) -> None:
    """Shutting down, a request that did not end when its task was cancelled: abort it in the
    engine and record it as aborted from here."""
    try:
        await generation_abort(gen)
    except Exception:
        logger.warning("could not abort request %s", gen.request_id, exc_info=True)
    await _finish(gen, outcome, aborted=True)


async def _complete(dialect: Dialect, gen: Generation, chunks: AsyncIterator[Chunk], outcome: Outcome) -> HttpResponse:
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                outcome.add(chunk)
    except asyncio.CancelledError:  # the client went away; aclosing aborted the request
        await _finish(gen, outcome, aborted=True)
        raise
    except Exception as exc:
        error = errors.internal_error(exc)
        await _finish(gen, outcome, error=error)
        return dialect.error_response(error)
    if outcome.error is not None:
        error = errors.from_error_info(outcome.error, prompt_param=gen.prompt_param)
        await _finish(gen, outcome, error=error)
        return dialect.error_response(error)
    await _finish(gen, outcome)
    body = dialect.body(gen, outcome)
    if dialect.keep is not None:
        await sync_to_async(dialect.keep)(gen, body)
    return JsonResponse(body)


async def _stream(dialect: Dialect, gen: Generation, chunks: AsyncIterator[Chunk], outcome: Outcome) -> HttpResponse:
    """Wait for the first chunk so that a refusal still gets its HTTP status, then stream."""
    try:
        first = await anext(chunks)
    except asyncio.CancelledError:
        await chunks.aclose()
        await _finish(gen, outcome, aborted=True)
        raise
    except Exception as exc:
        await chunks.aclose()
        error = errors.internal_error(exc)
        await _finish(gen, outcome, error=error)
        return dialect.error_response(error)
    outcome.add(first)
    if first.error is not None:
        await chunks.aclose()
        error = errors.from_error_info(first.error, prompt_param=gen.prompt_param)
        await _finish(gen, outcome, error=error)
        return dialect.error_response(error)
    response = StreamingHttpResponse(_events(dialect, gen, chunks, first, outcome), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # proxies must pass each event on at once
    return response


async def _events(dialect: Dialect, gen: Generation, chunks: AsyncIterator[Chunk], first: Chunk, outcome: Outcome):
    renderer, source = dialect.stream(gen), ChunkEvents(gen.num_choices, gen.tools)
    error: errors.OpenAIError | None = None
    if (running := tracked(gen.request_id)) is not None:
        running.task = asyncio.current_task()  # the server's task sending the response now
    try:
        async with aclosing(chunks):
            for part in (renderer.start(), *(renderer.events(i, e) for i, e in source.feed(first))):
                if part:
                    yield part
            if not first.finished:
                async for chunk in chunks:
                    outcome.add(chunk)
                    if chunk.error is not None:
                        error = errors.from_error_info(chunk.error, prompt_param=gen.prompt_param)
                        break
                    for index, events in source.feed(chunk):
                        if part := renderer.events(index, events):
                            yield part
        # Recorded before the last events: a client that has read the end finds its usage, and one
        # that hangs up right after it (the openai client does) cannot leave it unwritten.
        await _finish(gen, outcome, error=error)
        end = renderer.end(outcome, error)
        if dialect.keep is not None and renderer.final is not None:
            await sync_to_async(dialect.keep)(gen, renderer.final)
        yield end
    except Exception as exc:  # not CancelledError/GeneratorExit: those are the client leaving
        error = errors.internal_error(exc)
        await _finish(gen, outcome, error=error)
        yield renderer.fail(error)
    finally:  # the client left mid-stream (a no-op when the usage is recorded already)
        await _finish(gen, outcome, aborted=not outcome.finished, error=error)
