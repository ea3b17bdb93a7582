"""POST /tokenize and POST /detokenize in vLLM's shapes, with the served model's own tokenizer.

/tokenize takes ``model`` and either ``prompt`` (a string; ``add_special_tokens`` default true, as a
completion prompt is encoded) or ``messages`` (the chat template applied as chat completions apply
it; ``add_generation_prompt`` default true) and answers ``{"count", "max_model_len", "tokens"}``;
/detokenize takes ``model`` and ``tokens`` and answers ``{"prompt"}``. Like the rest of /v1 they
take an API key and see only the models it allows; every refusal is an OpenAI error object. They
run no generation, so they write no usage record.
"""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.response import Response

from webapp.openai_api.body import body_parse
from webapp.openai_api.serializers import (MAX_MESSAGES, MAX_MODEL_LENGTH, TOKEN_ID_LIMIT, ChatMessageSerializer,
                                          StrictCharField)
from webapp.openai_api.services import prompt_tokenize, tokens_detokenize
from webapp.openai_api.views import OpenAIApiView

MAX_PROMPT_CHARS = 4 * 1024 * 1024
MAX_TOKENS = 1024 * 1024  # ids per /detokenize call


class TokenizeApi(OpenAIApiView):
    """POST /tokenize."""

    class InputSerializer(serializers.Serializer):
        default_error_messages = {"invalid": "The request body must be a JSON object."}

        model = StrictCharField(max_length=MAX_MODEL_LENGTH)
        prompt = StrictCharField(required=False, allow_blank=True, trim_whitespace=False,
                                 max_length=MAX_PROMPT_CHARS)
        messages = ChatMessageSerializer(many=True, required=False, allow_empty=False, max_length=MAX_MESSAGES)
        add_special_tokens = serializers.BooleanField(required=False, allow_null=True)
        add_generation_prompt = serializers.BooleanField(default=True)

        def validate(self, attrs):
            if ("prompt" in attrs) == ("messages" in attrs):
                raise serializers.ValidationError({"prompt": "give exactly one of prompt and messages"})
            return attrs

    def post(self, request):
        serializer = self.InputSerializer(data=body_parse(request._request))
        serializer.is_valid(raise_exception=True)  # openai_exception_handler: 400 naming the parameter
        return Response(prompt_tokenize(api_key=request.auth, values=serializer.validated_data))


class DetokenizeApi(OpenAIApiView):
    """POST /detokenize."""

    class InputSerializer(serializers.Serializer):
        default_error_messages = {"invalid": "The request body must be a JSON object."}

        model = StrictCharField(max_length=MAX_MODEL_LENGTH)
        tokens = serializers.ListField(child=serializers.IntegerField(min_value=TOKEN_ID_LIMIT.low,
                                                                      max_value=TOKEN_ID_LIMIT.high),
                                       allow_empty=True, max_length=MAX_TOKENS)

    def post(self, request):
        serializer = self.InputSerializer(data=body_parse(request._request))
        serializer.is_valid(raise_exception=True)
        return Response(tokens_detokenize(api_key=request.auth, **serializer.validated_data))
