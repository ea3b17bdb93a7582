"""The OpenAI-compatible endpoints: each view validates its body with its own InputSerializer and
makes one service call (the models list and retrieve through DRF, the completions as async views)."""

from __future__ import annotations

import asyncio
import time

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.config.shutdown import shutting_down, track, tracked, untrack
from webapp.keys.selectors import apikey_allows_model
from webapp.openai_api import errors
from webapp.openai_api.body import body_parse
from webapp.openai_api.gate import get_gate
from webapp.openai_api.generation import generation_respond
from webapp.openai_api.schema import openapi_document
from webapp.openai_api.serializers import (MAX_MESSAGES, UNSUPPORTED, ChatMessageSerializer, PromptField,
                                          SamplingInputSerializer, check_tool_messages, limited)
from webapp.openai_api.tool_calls import tool_plan
from webapp.openai_api.services import (CHAT, COMPLETIONS, api_key_from_header, generation_admit,
                                        new_request_id, request_refused_record)
from webapp.registry.selectors import modelversion_get_active, modelversion_list_active
from webapp.usage.group_commit import usage_record_save


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request):
        api_key = api_key_from_header(request.headers.get("Authorization"))
        return api_key.owner, api_key

    def authenticate_header(self, request):
        return "Bearer"


def openai_exception_handler(exc, context):
    """Every exception of the DRF views as an OpenAI error object; a failure of ours says only that."""
    if isinstance(exc, APIException):  # DRF's own (405, 406...): their fixed messages
        exc = errors.OpenAIError(exc.status_code, str(exc.detail), code=exc.default_code)
    elif not isinstance(exc, errors.OpenAIError):
        exc = errors.internal_error(exc)
    return Response(exc.to_dict(), status=exc.status, headers=exc.headers)


class OpenAIApiView(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes: list = []
    renderer_classes = [JSONRenderer]

    def get_exception_handler(self):
        return openai_exception_handler


def _model_object(version) -> dict:
    return {"id": version.model.slug, "object": "model", "created": int(version.model.created_at.timestamp()),
            "owned_by": "pagoda"}


class ModelListApi(OpenAIApiView):
    """GET v1/models: the served models this key may use."""

    def get(self, request):
        api_key = request.auth
        data = [_model_object(v) for v in modelversion_list_active()
                if apikey_allows_model(api_key=api_key, model=v.model)]
        return Response({"object": "list", "data": data})


class ModelRetrieveApi(OpenAIApiView):
    """GET v1/models/<model>."""

    def get(self, request, model: str):
        version = modelversion_get_active(slug=model)
        if version is None or not apikey_allows_model(api_key=request.auth, model=version.model):
            raise errors.model_not_found(model)
        return Response(_model_object(version))


class CompletionApiBase(View):
    """Async Django views rather than DRF APIViews: DRF's views are synchronous, and a streamed
    response under Daphne has to come from an async iterator on the event loop, both to avoid
    holding a thread per open stream and to learn at once that the client went away (Django
    cancels the view / closes the iterator, which aborts the generation in the engine).

    ``dispatch`` plays the part of DRF's authentication and exception handler: the key is checked
    first (401, no usage record), and any refusal after that (a bad body, a limit, the server
    shutting down, the subclass's InputSerializer, an unknown model) leaves as an OpenAI error
    object with a usage record named by the response's X-Request-Id.

    From the key check on, the request is listed with config.shutdown's ``track`` until exactly one
    usage record is written: by generation_respond once the request reaches the engine, else here,
    whatever ends it: a refusal, a failure of ours, or the client hanging up (Django cancels this
    task) while the body is checked, the request admitted or tokenized. Writing it releases what
    admission took (the key's concurrency slot).
    """

    endpoint: str
    InputSerializer: type[SamplingInputSerializer]
    http_method_names = ["post"]

    async def dispatch(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.method.lower() not in self.http_method_names:
            return self.http_method_not_allowed(request)
        self.started, self.request_id, self.body = time.monotonic(), new_request_id(self.endpoint), None
        self.place = None  # at webapp/openai_api/gate.py's gate, once admitted
        try:
            self.api_key = await sync_to_async(api_key_from_header)(request.headers.get("Authorization"))
        except errors.OpenAIError as exc:
            return exc.response()
        track(self.request_id, asyncio.current_task(), cut=lambda: self.account(None))
        try:
            return await self.post(request)
        except (errors.OpenAIError, ValidationError) as exc:
            error = errors.from_validation_error(exc) if isinstance(exc, ValidationError) else exc
        except asyncio.CancelledError:  # the client went away (or the server is shutting down)
            await self.account(None)
            raise
        except Exception as exc:  # e.g. a tokenizer export gone missing: still an OpenAI error object
            error = errors.internal_error(exc)
        finally:
            if self.place is not None:
                self.place.release()
        await self.account(error)
        response = error.response()
        response["X-Request-Id"] = self.request_id  # names its usage record
        return response

    async def post(self, request: HttpRequest) -> HttpResponse:
        await self.admit(request)
        serializer = self.InputSerializer(data=self.body)
        serializer.is_valid(raise_exception=True)
        return await generation_respond(request_id=self.request_id, endpoint=self.endpoint, api_key=self.api_key,
                                        values=serializer.validated_data, started=self.started)

    async def admit(self, request: HttpRequest) -> None:
        """Parse the body into ``self.body``, let the key's limits admit the request, then the gate in
        front of the model's queue (unless the body names no model: the serializer says so); OpenAIError if not."""
        self.body = body_parse(request)
        if shutting_down():
            raise errors.server_shutting_down()
        await sync_to_async(generation_admit)(api_key=self.api_key, request_id=self.request_id)
        model = self.body.get("model") if isinstance(self.body, dict) else None
        if isinstance(model, str) and model:
            self.place = await get_gate().enter(model)

    async def account(self, error: errors.OpenAIError | None) -> None:
        """Write the usage record of a request that did not reach the engine (``error`` None: the
        client left), unless one is written already: a generation records its own."""
        entry = tracked(self.request_id)
        if entry is None or entry.finishing:
            return
        entry.finishing = True
        try:  # cancelled again meanwhile, the thread still builds the record and the group commit saves it
            record = await sync_to_async(request_refused_record)(
                request_id=self.request_id, endpoint=self.endpoint, api_key=self.api_key, data=self.body,
                error=error, started=self.started)
            await usage_record_save(record)
        finally:
            untrack(self.request_id, entry)

    def http_method_not_allowed(self, request, *args, **kwargs):
        return errors.method_not_allowed(request.method, ["POST"]).response()


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
    """POST v1/completions."""

    endpoint = COMPLETIONS

    class InputSerializer(SamplingInputSerializer):
        prompt = PromptField()
        logprobs = limited("logprobs")


@csrf_exempt
def unknown_url(request: HttpRequest) -> HttpResponse:
    """Any v1/ path no view above serves, whatever the method."""
    return errors.url_not_found(request.method, request.path).response()


@csrf_exempt
def openapi_schema(request: HttpRequest) -> HttpResponse:
    """GET v1/openapi.json: the /v1 endpoints and their parameters' ranges, built from the InputSerializers."""
    if request.method not in ("GET", "HEAD"):
        return errors.method_not_allowed(request.method, ["GET"]).response()
    return JsonResponse(openapi_document({"/v1/chat/completions": ChatCompletionCreateApi.InputSerializer,
                                          "/v1/completions": CompletionCreateApi.InputSerializer}))
