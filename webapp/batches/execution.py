"""One batch line through the API's own generation path, and the output line it leaves.

The steps are the ones a ``POST /v1/chat/completions`` takes (webapp/openai_api/lifecycle.py and
generation.py), through the same service functions: the body checked by the endpoint's
InputSerializer, ``generation_admit`` (the key's concurrency, request-rate and budget limits),
``generation_prepare`` (model scope, tokenizing, the worst case reserved against the key), the
engine request, then ``generation_finish`` (the usage record, the key's slot and tokens settled),
or ``request_refused`` for a line refused before it reached the engine. Only the priority differs:
every line runs at BATCH_PRIORITY, the engine's lowest.

The ORM steps run in the runner's thread; ``collect`` runs on the runner's event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field

from django.utils import timezone

from webapp.batches.lines import CHAT_URL, LineError, check_body
from webapp.batches.models import BatchLine
from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.prompts import generation_chunks
from webapp.openai_api.responses import completion_body
from webapp.openai_api.services import (CHAT, COMPLETIONS, Generation, generation_admit, generation_finish,
                                        generation_prepare, new_request_id, request_refused)
from webapp.usage.checkpoints import get_checkpoints
from webapp.usage.outcome import Outcome
from workers.protocol import NO_WORKER, QUEUE_TIMEOUT, QUEUE_UNAVAILABLE, SERVER_OVERLOADED, WORKER_LOST
from workers.schema import MAX_INT32

# Lower values are served first under the engine's "priority" policy: batch lines come last, and
# are the first preempted when the KV cache runs out.
BATCH_PRIORITY = MAX_INT32
# Refusals that pass with time: the line is tried again. Waiting for capacity (a limit, a queue,
# a worker starting) is not an attempt; a worker lost under the line is (up to PAGODA_BATCH_MAX_ATTEMPTS).
CAPACITY_CODES = {"rate_limit_exceeded", NO_WORKER, SERVER_OVERLOADED, QUEUE_TIMEOUT, QUEUE_UNAVAILABLE,
                  "server_shutting_down"}
RETRYABLE_CODES = CAPACITY_CODES | {WORKER_LOST}
DEFAULT_RETRY_S = 2.0


@dataclass
class Running:
    """A line sent to the engine: its generation, what came back so far, and its task."""

    line: BatchLine
    generation: Generation
    outcome: Outcome = field(default_factory=Outcome)
    task: asyncio.Task | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    preempted: bool = False  # cancelled to leave the steps to interactive requests: queued again
    is_minimum_share: bool = False  # let in while others run, the batch having waited too long: not preempted


@dataclass
class Ended:
    """How a line ended: its output line, or a retry after ``retry_after`` seconds."""

    result: dict | None = None
    ok: bool = False
    retry_after: float | None = None
    uncounted: bool = False  # a wait for capacity, not an attempt
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def output_line(line: BatchLine, *, status_code: int | None, request_id: str, body: dict | None,
                error: dict | None = None) -> dict:
    """A line of the output or error file, in OpenAI's format."""
    response = None if status_code is None else {"status_code": status_code, "request_id": request_id, "body": body}
    return {"id": "batch_req_" + uuid.uuid4().hex[:24], "custom_id": line.custom_id, "response": response,
            "error": error}


def _refusal(line: BatchLine, request_id: str, error: errors.OpenAIError, *, can_retry: bool) -> Ended:
    retry = error.headers.get("Retry-After")
    passes = retry is not None or error.code != "rate_limit_exceeded"  # over the limit itself: it never will
    if passes and (error.code in CAPACITY_CODES or (can_retry and error.code in RETRYABLE_CODES)):
        return Ended(retry_after=float(retry) if retry else DEFAULT_RETRY_S, uncounted=error.code in CAPACITY_CODES)
    return Ended(result=output_line(line, status_code=error.status, request_id=request_id, body=error.to_dict()))


def key_usable(api_key: ApiKey | None) -> bool:
    """As the API's authentication decides (apikey_get_usable), from the row as it is now."""
    if api_key is None:
        return False
    api_key.refresh_from_db(fields=["is_revoked", "expires_at"])
    expired = api_key.expires_at is not None and api_key.expires_at <= timezone.now()
    return not (api_key.is_revoked or expired or not api_key.owner.is_active)


def line_start(*, line: BatchLine, api_key: ApiKey | None, can_retry: bool) -> Running | Ended:
    """Admit and prepare a line as the API would; Ended when it is refused before the engine (its
    usage record written, as the API writes one for a refused request; none for a key that is
    no longer usable, as the API writes none for a request it cannot authenticate)."""
    endpoint = CHAT if line.url == CHAT_URL else COMPLETIONS
    request_id, started = new_request_id(endpoint), time.monotonic()
    if not key_usable(api_key):
        error = errors.invalid_api_key("The batch's API key was revoked, has expired or was deleted.")
        return Ended(result=output_line(line, status_code=error.status, request_id=request_id, body=error.to_dict()))
    line.request_id = request_id
    line.status = BatchLine.Status.RUNNING
    line.num_attempts += 1
    line.save(update_fields=["request_id", "status", "num_attempts"])
    try:
        generation_admit(api_key=api_key, request_id=request_id)
        try:
            values = dict(check_body(line.line_number, line.url, line.body))
        except LineError as exc:
            raise errors.invalid_parameter(exc.field.removeprefix("body.") if exc.field else None, exc.message)
        values.pop("priority", None)  # a line's priority is the batch's
        generation = generation_prepare(request_id=request_id, endpoint=endpoint, api_key=api_key, values=values,
                                        started=started)
    except errors.OpenAIError as error:
        request_refused(request_id=request_id, endpoint=endpoint, api_key=api_key, data=line.body, error=error,
                        started=started)
        return _refusal(line, request_id, error, can_retry=can_retry)
    generation.priority = BATCH_PRIORITY
    return Running(line, generation)


async def collect(running: Running) -> bool:
    """Run the line's engine request to its end; True when it was cancelled (aborted in the engine)."""
    running.task = asyncio.current_task()
    if running.cancelled.is_set():
        return True
    chunks = generation_chunks(running.generation)  # a completion's list of prompts: merged
    get_checkpoints().watch(running.generation.request_id, running.outcome, running.generation.started)
    try:
        async with aclosing(chunks):  # closing early aborts the request in the engine
            async for chunk in chunks:
                running.outcome.add(chunk)
    except asyncio.CancelledError:
        return True
    finally:
        get_checkpoints().unwatch(running.generation.request_id)
    return False


def line_finish(*, running: Running, aborted: bool, failure: BaseException | None, can_retry: bool) -> Ended:
    """Record the usage of a line that reached the engine and say how it ended."""
    gen, outcome, line = running.generation, running.outcome, running.line
    error = None
    if failure is not None:
        error = errors.internal_error(failure)
    elif not aborted and outcome.error is not None:
        error = errors.from_error_info(outcome.error, prompt_param=gen.prompt_param)
    record = generation_finish(generation=gen, outcome=outcome, aborted=aborted, error=error)
    counts = dict(prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens,
                  cached_tokens=record.cached_prompt_tokens)
    if aborted:
        return Ended(result=output_line(line, status_code=None, request_id=gen.request_id, body=None, error={
            "code": "batch_cancelled", "message": "The batch was cancelled while this request ran; it was aborted."}),
            **counts)
    if error is not None:
        ended = _refusal(line, gen.request_id, error, can_retry=can_retry)
        ended.prompt_tokens, ended.completion_tokens, ended.cached_tokens = (
            counts["prompt_tokens"], counts["completion_tokens"], counts["cached_tokens"])
        return ended
    return Ended(result=output_line(line, status_code=200, request_id=gen.request_id,
                                    body=completion_body(gen, outcome)), ok=True, **counts)
