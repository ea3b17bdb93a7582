"""The OpenAI-compatible endpoints. Thin: each delegates to services / generation."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views import View
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.keys.selectors import apikey_allows_model
from webapp.openai_api import errors
from webapp.openai_api.generation import respond
from webapp.openai_api.services import CHAT, COMPLETIONS, api_key_from_header
from webapp.registry.selectors import modelversion_get_active, modelversion_list_active


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request):
        api_key = api_key_from_header(request.headers.get("Authorization"))
        return api_key.owner, api_key

    def authenticate_header(self, request):
        return "Bearer"


def openai_exception_handler(exc, context):
    if isinstance(exc, errors.OpenAIError):
        return Response(exc.to_dict(), status=exc.status)
    if isinstance(exc, APIException):
        error = errors.OpenAIError(exc.status_code, str(exc.detail), code=exc.default_code)
        return Response(error.to_dict(), status=exc.status_code)
    return None


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
        if version is None:
            raise errors.model_not_found(model)
        if not apikey_allows_model(api_key=request.auth, model=version.model):
            raise errors.model_not_allowed(model)
        return Response(_model_object(version))


class CompletionApiBase(View):
    """Async Django views rather than DRF APIViews: DRF's views are synchronous, and a streamed
    response under Daphne has to come from an async iterator on the event loop, both to avoid
    holding a thread per open stream and to learn at once that the client went away (Django
    cancels the view / closes the iterator, which aborts the generation in the engine). DRF
    serializers still validate the body, inside generation_prepare.
    """

    endpoint: str
    http_method_names = ["post"]

    async def post(self, request: HttpRequest) -> HttpResponse:
        return await respond(request, self.endpoint)

    def http_method_not_allowed(self, request, *args, **kwargs):
        response = errors.OpenAIError(405, f"Method {request.method} is not allowed; use POST.",
                                      code="method_not_allowed").response()
        response["Allow"] = "POST"
        if self.view_is_async:
            async def wrapped():
                return response
            return wrapped()
        return response


class ChatCompletionCreateApi(CompletionApiBase):
    """POST v1/chat/completions."""

    endpoint = CHAT


class CompletionCreateApi(CompletionApiBase):
    """POST v1/completions."""

    endpoint = COMPLETIONS
