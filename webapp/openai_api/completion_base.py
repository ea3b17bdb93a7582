"""The base of the async POST views of the OpenAI dialect (the completions, the embeddings): each
validates its body with its own InputSerializer once lifecycle.completion_create has admitted the
request."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views import View
from rest_framework import serializers

from webapp.openai_api import errors
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.lifecycle import completion_create
from webapp.openai_api.responses import StreamFormatter, completion_body


class CompletionApiBase(View):
    """Async Django views rather than DRF APIViews: DRF's views are synchronous, and a streamed
    response under Daphne has to come from an async iterator on the event loop, both to avoid
    holding a thread per open stream and to learn at once that the client went away (Django
    cancels the view / closes the iterator, which aborts the generation in the engine).

    The key check, admission and the usage record of a refusal come before and around the
    InputSerializer (webapp/openai_api/lifecycle.py), so the service calls ``validate`` once the
    request is admitted."""

    endpoint: str
    InputSerializer: type[serializers.Serializer]
    http_method_names = ["post"]

    def dialect(self) -> Dialect:
        return Dialect(endpoint=self.endpoint, validate=self.validate, body=completion_body, stream=StreamFormatter)

    async def post(self, request: HttpRequest) -> HttpResponse:
        return await completion_create(request=request, dialect=self.dialect())

    def validate(self, body) -> dict:
        serializer = self.InputSerializer(data=body)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    async def http_method_not_allowed(self, request, *args, **kwargs):
        return errors.method_not_allowed(request.method, ["POST"]).response()
