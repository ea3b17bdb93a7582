"""POST v1/embeddings: OpenAI's embeddings endpoint, its body validated here, run by embeddings.py.

==================== ====================================== =====================================
parameter            range                                  source
==================== ====================================== =====================================
model                a string of at most 200 characters     UsageRecord.model_name
input                a non-empty string, 1 .. 2048 of them, OpenAI (each input within the
                     1 .. 2**31-1 token ids, or 1 .. 2048   model's maximum length: embeddings.py)
                     lists of token ids (each 0 .. 2**31-1)
encoding_format      float (default) or base64              OpenAI
dimensions           1 .. 2**31-1; the model's own only     embeddings.py
user                 a string of at most 256 characters     UsageRecord.end_user
==================== ====================================== =====================================
"""

from __future__ import annotations

from rest_framework import serializers

from webapp.openai_api.completion_base import CompletionApiBase
from webapp.openai_api.embeddings import embedding_respond
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.serializers import (MAX_MODEL_LENGTH, MAX_USER_LENGTH, TOKEN_ID_LIMIT,
                                          LimitField, StrictCharField)
from webapp.openai_api.services import EMBEDDINGS
from workers.schema import MAX_INT32, Limit

MAX_INPUTS = 2048  # OpenAI's cap on inputs per request


class EmbeddingInputField(serializers.Field):
    """OpenAI's ``input``: a string, a list of strings, a list of token ids or a list of those
    lists; always returned as a list of inputs (each a string or a list of token ids)."""

    default_error_messages = {
        "invalid": ("must be a string, a list of strings, a list of token ids (integers from 0 to "
                    f"{TOKEN_ID_LIMIT.high}) or a list of lists of token ids"),
        "too_many": f"at most {MAX_INPUTS} inputs per request",
        "empty": "must not be empty",
        "empty_item": "input[{index}] must not be empty"}

    def to_internal_value(self, data) -> list[str | list[int]]:
        if isinstance(data, str):
            data = [data]
        elif isinstance(data, list) and data and all(TOKEN_ID_LIMIT.allows(t) for t in data):
            data = [data]
        if not isinstance(data, list):
            self.fail("invalid")
        if not data:
            self.fail("empty")
        if len(data) > MAX_INPUTS:
            self.fail("too_many")
        is_text = isinstance(data[0], str)  # one kind throughout, as OpenAI's schema has it
        for index, item in enumerate(data):
            if not (isinstance(item, str) if is_text else (
                    isinstance(item, list) and all(TOKEN_ID_LIMIT.allows(t) for t in item))):
                self.fail("invalid")
            if not item:
                self.fail("empty_item", index=index)
        return data

    def to_representation(self, value):
        return value

    @property
    def json_schema(self) -> dict:
        ids = {"type": "array", "minItems": 1,
               "items": {"type": "integer", "minimum": TOKEN_ID_LIMIT.low, "maximum": TOKEN_ID_LIMIT.high}}
        text = {"type": "string", "minLength": 1}
        return {"anyOf": [text, {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": text}, ids,
                          {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": ids}]}


class EmbeddingCreateApi(CompletionApiBase):
    """POST v1/embeddings. An async view like the completions: the key check, admission, limits and
    the usage record of a refusal are theirs (lifecycle.py); embeddings.py runs it."""

    endpoint = EMBEDDINGS

    class InputSerializer(serializers.Serializer):
        default_error_messages = {"invalid": "The request body must be a JSON object."}

        model = StrictCharField(max_length=MAX_MODEL_LENGTH)
        input = EmbeddingInputField()
        encoding_format = serializers.ChoiceField(["float", "base64"], required=False, allow_null=True)
        dimensions = LimitField(Limit(int, 1, MAX_INT32))
        user = StrictCharField(max_length=MAX_USER_LENGTH, required=False, allow_blank=True)

    def dialect(self) -> Dialect:
        return Dialect(endpoint=self.endpoint, validate=self.validate, respond=embedding_respond)
