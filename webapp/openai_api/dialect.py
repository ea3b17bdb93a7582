"""What makes one API one API: how its body becomes the internal generation request, and how the
one internal event stream (webapp/openai_api/events.py) and its errors are rendered back.

Everything between (the key check, admission, limits, scopes, tokenizing, the engine request,
cancellation, the usage record, the shutdown drain) is the one serving path of
webapp/openai_api/lifecycle.py and generation.py, whatever the API. A fourth API is one more
``Dialect``: a validator, a body renderer, a stream renderer and an error shape.

The internal generation request is the dict ``generation_prepare`` takes (webapp/openai_api/services.py):
``model``; ``messages`` (chat messages as OpenAI's chat completions take them, tool calls and tool
results included) or ``prompt``; ``max_tokens``; the sampling fields of services.SAMPLING_FIELDS;
``tool_plan`` and ``structured_outputs``; ``stream``, ``n``, ``user``, ``priority``; logprobs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from django.http import HttpRequest, HttpResponse, JsonResponse

from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.events import Event
from webapp.openai_api.services import Generation, api_key_from_header
from webapp.usage.outcome import Outcome


class StreamRenderer(Protocol):
    """One streamed response's bytes (server-sent events), in order."""

    def start(self) -> bytes: ...

    def events(self, index: int, events: list[Event]) -> bytes: ...

    def end(self, outcome: Outcome, error: errors.OpenAIError | None) -> bytes:
        """After the last event (``error``: the generation failed mid-stream)."""

    def fail(self, error: errors.OpenAIError) -> bytes:
        """A failure of ours mid-stream."""

    @property
    def final(self) -> dict | None:
        """The whole response object once ``end`` ran (what ``Dialect.keep`` stores), if the API has one."""


def openai_error_body(error: errors.OpenAIError) -> dict:
    return error.to_dict()


def bearer(request: HttpRequest) -> str | None:
    return request.headers.get("Authorization")


@dataclass(frozen=True)
class Dialect:
    endpoint: str  # the usage records' endpoint
    validate: Callable[[object], dict]  # the admitted body -> the internal request (ValidationError / OpenAIError)
    body: Callable[[Generation, Outcome], dict] | None = None  # the non-streamed answer
    stream: Callable[[Generation], StreamRenderer] | None = None
    error_body: Callable[[errors.OpenAIError], dict] = openai_error_body
    authorization: Callable[[HttpRequest], str | None] = bearer  # "Bearer <key>" from the API's own headers
    # Synchronous hooks (the ORM), both optional: ``resolve`` completes the validated request with
    # stored state (a previous response); ``keep`` is handed the finished response object.
    resolve: Callable[..., dict] | None = None  # (api_key=, values=) -> values
    keep: Callable[[Generation, dict], None] | None = None
    # An API that does not generate (the embeddings) runs its admitted request itself, in place of
    # generation.generation_respond (same keywords), and needs no ``body`` or ``stream``.
    respond: Callable[..., Awaitable[HttpResponse]] | None = None

    def error_response(self, error: errors.OpenAIError) -> JsonResponse:
        response = JsonResponse(self.error_body(error), status=error.status)
        for name, value in error.headers.items():
            response[name] = value
        return response

    def key(self, request: HttpRequest) -> ApiKey:
        return api_key_from_header(self.authorization(request))
