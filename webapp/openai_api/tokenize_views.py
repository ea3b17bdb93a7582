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
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from webapp.keys.selectors import apikey_allows_model
from webapp.openai_api import errors
from webapp.openai_api.body import body_parse
from webapp.openai_api.serializers import (MAX_MESSAGES, MAX_MODEL_LENGTH, TOKEN_ID_LIMIT, ChatMessageSerializer,
                                          StrictCharField)
from webapp.openai_api.services import _template_messages
from webapp.openai_api.views import OpenAIApiView
from webapp.registry.selectors import modelversion_get_active
from webapp.registry.tokenizers import ChatTemplateError, ModelTokenizer, load_tokenizer

MAX_PROMPT_CHARS = 4 * 1024 * 1024
MAX_TOKENS = 1024 * 1024  # ids per /detokenize call


class TokenizeInputSerializer(serializers.Serializer):
    default_error_messages = {"invalid": "The request body must be a JSON object."}

    model = StrictCharField(max_length=MAX_MODEL_LENGTH)
    prompt = StrictCharField(required=False, allow_blank=True, trim_whitespace=False, max_length=MAX_PROMPT_CHARS)
    messages = ChatMessageSerializer(many=True, required=False, allow_empty=False, max_length=MAX_MESSAGES)
    add_special_tokens = serializers.BooleanField(required=False, allow_null=True)
    add_generation_prompt = serializers.BooleanField(default=True)

    def validate(self, attrs):
        if ("prompt" in attrs) == ("messages" in attrs):
            raise serializers.ValidationError({"prompt": "give exactly one of prompt and messages"})
        return attrs


class DetokenizeInputSerializer(serializers.Serializer):
    default_error_messages = {"invalid": "The request body must be a JSON object."}

    model = StrictCharField(max_length=MAX_MODEL_LENGTH)
    tokens = serializers.ListField(child=serializers.IntegerField(min_value=TOKEN_ID_LIMIT.low,
                                                                  max_value=TOKEN_ID_LIMIT.high),
                                   allow_empty=True, max_length=MAX_TOKENS)


def _validated(serializer_class, request) -> dict:
    serializer = serializer_class(data=body_parse(request._request))
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from None
    return serializer.validated_data


def _served(api_key, slug: str):
    """(the active version, its tokenizer) of a model the key may use; OpenAIError otherwise."""
    version = modelversion_get_active(slug=slug)
    if version is None or not apikey_allows_model(api_key=api_key, model=version.model):
        raise errors.model_not_found(slug)
    if not version.tokenizer_dir:
        raise errors.OpenAIError(503, f"the model {slug!r} is still being prepared", type="server_error",
                                 param="model", code="model_not_ready")
    return version, load_tokenizer(version.tokenizer_dir)


def _encode(tokenizer: ModelTokenizer, values: dict) -> list[int]:
    if "prompt" in values:
        add_special = values.get("add_special_tokens")
        return tokenizer.encode(values["prompt"], add_special_tokens=True if add_special is None else add_special)
    try:
        text = tokenizer.render_chat(_template_messages(values["messages"]),
                                     add_generation_prompt=values["add_generation_prompt"])
    except ChatTemplateError as exc:
        raise errors.invalid_parameter("messages", str(exc)) from exc
    return tokenizer.encode(text, add_special_tokens=bool(values.get("add_special_tokens")))


class TokenizeApi(OpenAIApiView):
    """POST /tokenize."""

    def post(self, request):
        values = _validated(TokenizeInputSerializer, request)
        version, tokenizer = _served(request.auth, values["model"])
        tokens = _encode(tokenizer, values)
        max_model_len = version.engine_settings.get("max_model_len") or tokenizer.max_model_len
        return Response({"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens})


class DetokenizeApi(OpenAIApiView):
    """POST /detokenize."""

    def post(self, request):
        values = _validated(DetokenizeInputSerializer, request)
        _version, tokenizer = _served(request.auth, values["model"])
        vocab = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        bad = [t for t in values["tokens"] if t >= vocab]
        if bad:
            raise errors.invalid_parameter("tokens", f"token ids must be below the vocabulary size {vocab}, "
                                                     f"got {bad[:5]}")
        return Response({"prompt": tokenizer.tokenizer.decode(values["tokens"], skip_special_tokens=False)})
