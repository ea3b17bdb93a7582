"""Anthropic's Messages API: ``POST v1/messages`` through the one serving path
(webapp/openai_api/lifecycle.py) as the ``MESSAGES`` dialect, and ``POST v1/messages/count_tokens``.

Pagoda's API keys are accepted as Anthropic's clients send them (``x-api-key``) or as a bearer
token; ``anthropic-version`` is accepted whatever its value. Every refusal is an Anthropic error
object (webapp/openai_api/anthropic_render.py).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import View
from rest_framework.exceptions import ValidationError

from webapp.openai_api import errors
from webapp.openai_api.anthropic_input import CountTokensInputSerializer, MessagesInputSerializer
from webapp.openai_api.anthropic_render import MessageStream, error_body, message_body
from webapp.openai_api.body import body_parse
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.lifecycle import completion_create
from webapp.openai_api.services import MESSAGES, chat_prompt_count


def anthropic_authorization(request: HttpRequest) -> str | None:
    key = request.headers.get("X-Api-Key")
    return f"Bearer {key}" if key else request.headers.get("Authorization")


def _validated(serializer_class, body) -> dict:
    serializer = serializer_class(data=body)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


MESSAGES_DIALECT = Dialect(endpoint=MESSAGES, validate=lambda body: _validated(MessagesInputSerializer, body),
                           body=message_body, stream=MessageStream, error_body=error_body,
                           authorization=anthropic_authorization)


class AnthropicView(View):
    http_method_names = ["post"]

    async def http_method_not_allowed(self, request, *args, **kwargs):
        return MESSAGES_DIALECT.error_response(errors.method_not_allowed(request.method, ["POST"]))


class MessageCreateApi(AnthropicView):
    """POST v1/messages."""

    async def post(self, request: HttpRequest) -> HttpResponse:
        return await completion_create(request=request, dialect=MESSAGES_DIALECT)


class MessageCountTokensApi(AnthropicView):
    """POST v1/messages/count_tokens: ``{"input_tokens"}`` of the request; no generation, no usage record."""

    async def post(self, request: HttpRequest) -> HttpResponse:
        try:
            api_key = await sync_to_async(MESSAGES_DIALECT.key)(request)
            values = _validated(CountTokensInputSerializer, body_parse(request))
            count = await sync_to_async(chat_prompt_count)(api_key=api_key, values=values)
        except ValidationError as exc:
            return MESSAGES_DIALECT.error_response(errors.from_validation_error(exc))
        except errors.OpenAIError as exc:
            return MESSAGES_DIALECT.error_response(exc)
        return JsonResponse({"input_tokens": count})
