"""The OpenAI-compatible endpoints: each view validates its body with its own InputSerializer and
makes one service call (the models list and retrieve through DRF, the completions as async views)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.keys.selectors import apikey_allows_adapter, apikey_allows_model
from webapp.openai_api import errors
from webapp.openai_api.anthropic_input import CountTokensInputSerializer, MessagesInputSerializer
from webapp.openai_api.body import JsonBodyParser
from webapp.openai_api.completion_base import CompletionApiBase
from webapp.openai_api.embedding_views import EmbeddingCreateApi
from webapp.openai_api.responses_input import ResponseInputSerializer
from webapp.openai_api.schema import openapi_document
from webapp.openai_api.completion_extras import check_extras
from webapp.openai_api.serializers import (MAX_MESSAGES, MAX_N, MAX_SEQUENCES, UNSUPPORTED, ChatMessageSerializer,
                                          PromptField, SamplingInputSerializer, StrictCharField, check_tool_messages,
                                          limited)
from webapp.openai_api.services import CHAT, COMPLETIONS, api_key_from_header, model_target_for_key
from webapp.openai_api.tool_calls import tool_plan
from webapp.registry.adapters import adapter_list_active
from webapp.registry.selectors import modelversion_list_active


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request):
        api_key = api_key_from_header(request.headers.get("Authorization"))
        return api_key.owner, api_key

    def authenticate_header(self, request):
        return "Bearer"


def openai_exception_handler(exc, context):
    """Every exception of the DRF views as an OpenAI error object; a failure of ours says only that."""
    if isinstance(exc, ValidationError):  # an InputSerializer's refusal: the first bad parameter
        exc = errors.from_validation_error(exc)
    elif isinstance(exc, APIException):  # DRF's own (405, 406...): their fixed messages
        exc = errors.OpenAIError(exc.status_code, str(exc.detail), code=exc.default_code)
    elif not isinstance(exc, errors.OpenAIError):
        exc = errors.internal_error(exc)
    return Response(exc.to_dict(), status=exc.status, headers=exc.headers)


class OpenAIApiView(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes: list = []
    parser_classes = [JsonBodyParser]  # JSON as the completions read it (webapp/openai_api/body.py)
    renderer_classes = [JSONRenderer]

    def get_exception_handler(self):
        return openai_exception_handler


def _model_object(version) -> dict:
    return {"id": version.model.slug, "object": "model", "created": int(version.model.created_at.timestamp()),
            "owned_by": "pagoda"}


def _adapter_object(adapter) -> dict:
    """A LoRA adapter as a model; ``parent`` names its base (as vLLM lists adapters)."""
    return {"id": adapter.name, "object": "model", "created": int(adapter.created_at.timestamp()),
            "owned_by": "pagoda", "parent": adapter.base.slug}


class ModelListApi(OpenAIApiView):
    """GET v1/models: the served models this key may use."""

    def get(self, request):
        api_key = request.auth
        data = [_model_object(v) for v in modelversion_list_active()
                if apikey_allows_model(api_key=api_key, model=v.model)]
        data += [_adapter_object(a) for a in adapter_list_active()
                 if apikey_allows_adapter(api_key=api_key, adapter=a)]
        return Response({"object": "list", "data": data})


class ModelRetrieveApi(OpenAIApiView):
    """GET v1/models/<model>."""

    def get(self, request, model: str):
        version, adapter = model_target_for_key(api_key=request.auth, slug=model)
        return Response(_model_object(version) if adapter is None else _adapter_object(adapter))


class ChatCompletionCreateApi(CompletionApiBase):
    """POST v1/chat/completions."""

    endpoint = CHAT

    class InputSerializer(SamplingInputSerializer):
        unsupported = tuple(name for name in UNSUPPORTED if name not in ("tools", "tool_choice"))
        messages = ChatMessageSerializer(many=True, allow_empty=False, max_length=MAX_MESSAGES)
        max_completion_tokens = limited("max_tokens")
        logprobs = serializers.BooleanField(required=False, allow_null=True)
        top_logprobs = limited("logprobs")

        def validate(self, attrs):
            attrs = super().validate(attrs)
            if attrs.get("top_logprobs") is not None and not attrs.get("logprobs"):
                raise serializers.ValidationError({"top_logprobs": "requires logprobs to be true"})
            check_tool_messages(attrs["messages"])
            attrs["tool_plan"] = plan = tool_plan(self.initial_data)  # webapp/openai_api/tool_calls.py
            if plan is not None and plan.constraint is not None:
                if attrs["structured_outputs"] is not None:
                    raise serializers.ValidationError({"tool_choice": (
                        "a required or named tool call cannot be combined with response_format")})
                attrs["structured_outputs"] = plan.constraint
            return attrs


class CompletionCreateApi(CompletionApiBase):
    """POST v1/completions. ``prompt`` may list several prompts (webapp/openai_api/prompts.py):
    their choices come prompt by prompt, index = prompt index x n + sample index."""

    endpoint = COMPLETIONS

    class InputSerializer(SamplingInputSerializer):
        unsupported = tuple(name for name in UNSUPPORTED if name not in ("best_of", "echo", "suffix"))
        prompt = PromptField()
        logprobs = limited("logprobs")
        echo = serializers.BooleanField(required=False, allow_null=True)
        suffix = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
        best_of = serializers.IntegerField(required=False, allow_null=True)

        def validate(self, attrs):
            attrs = super().validate(attrs)
            check_extras(attrs, MAX_N, MAX_SEQUENCES)  # webapp/openai_api/completion_extras.py
            return attrs


@csrf_exempt
def unknown_url(request: HttpRequest) -> HttpResponse:
    """Any v1/ path no view above serves, whatever the method."""
    return errors.url_not_found(request.method, request.path).response()


@csrf_exempt
def openapi_schema(request: HttpRequest) -> HttpResponse:
    """GET v1/openapi.json: the /v1 endpoints and their parameters' ranges, built from the InputSerializers."""
    if request.method not in ("GET", "HEAD"):
        return errors.method_not_allowed(request.method, ["GET"]).response()
    return JsonResponse(openapi_document({
        "/v1/chat/completions": ("createChatCompletion", ChatCompletionCreateApi.InputSerializer),
        "/v1/completions": ("createCompletion", CompletionCreateApi.InputSerializer),
        "/v1/embeddings": ("createEmbedding", EmbeddingCreateApi.InputSerializer),
        "/v1/responses": ("createResponse", ResponseInputSerializer),
        "/v1/messages": ("createMessage", MessagesInputSerializer),
        "/v1/messages/count_tokens": ("countMessageTokens", CountTokensInputSerializer),
    }, anthropic_paths=frozenset({"/v1/messages", "/v1/messages/count_tokens"})))
