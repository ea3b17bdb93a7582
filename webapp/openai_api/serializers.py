"""The fields and parameters both completion endpoints validate; each API view's own InputSerializer
(webapp/openai_api/views.py) adds what is particular to it.

Ranges follow OpenAI's API (e.g. temperature 0..2) so that a request that passes here means what
it means there; the engine re-validates the sampling parameters it receives.
"""

from __future__ import annotations

from rest_framework import serializers

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_USER_LENGTH = 256  # UsageRecord.end_user holds it
# OpenAI parameters we do not implement: refused when set, so that nobody silently gets less.
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "logit_bias", "best_of", "suffix",
               "echo", "audio", "modalities", "prediction", "web_search_options")


class StopField(serializers.Field):
    default_error_messages = {"invalid": "must be a string or a list of strings",
                              "too_many": f"at most {MAX_STOP_STRINGS} stop sequences"}

    def to_internal_value(self, data) -> list[str]:
        stops = [data] if isinstance(data, str) else data
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            self.fail("invalid")
        if len(stops) > MAX_STOP_STRINGS:
            self.fail("too_many")
        return stops

    def to_representation(self, value):
        return value


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers instead of turning them into strings, as OpenAI does."""

    default_error_messages = {"invalid": "must be a string"}

    def to_internal_value(self, data) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class MessageContentField(serializers.Field):
    """A string, or OpenAI content parts of which only text parts are accepted (joined)."""

    default_error_messages = {"invalid": "must be a string or a list of text content parts",
                              "not_text": "only text content parts are supported by this model"}

    def to_internal_value(self, data) -> str:
        if isinstance(data, str):
            return data
        if not isinstance(data, list) or not all(isinstance(p, dict) for p in data):
            self.fail("invalid")
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in data):
            self.fail("not_text")
        return "".join(p["text"] for p in data)

    def to_representation(self, value):
        return value


class PromptField(serializers.Field):
    """One prompt: a string or a list of token ids (or either, alone in a list)."""

    default_error_messages = {"invalid": "must be a string or a list of token ids",
                              "many": "only one prompt per request is supported",
                              "empty": "must not be empty"}

    def to_internal_value(self, data) -> str | list[int]:
        if isinstance(data, list) and data and isinstance(data[0], (str, list)):
            if len(data) != 1:
                self.fail("many")
            data = data[0]
        if isinstance(data, str):
            if not data:
                self.fail("empty")
            return data
        if isinstance(data, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in data):
            if not data:
                self.fail("empty")
            return data
        self.fail("invalid")

    def to_representation(self, value):
        return value


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(default=False)


class SamplingInputSerializer(serializers.Serializer):
    """The parameters both endpoints share."""

    default_error_messages = {"invalid": "The request body must be a JSON object."}

    model = serializers.CharField()
    max_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = serializers.FloatField(min_value=0, max_value=1, required=False, allow_null=True)
    n = serializers.IntegerField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    seed = serializers.IntegerField(required=False, allow_null=True)
    presence_penalty = serializers.FloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    frequency_penalty = serializers.FloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    # Who the caller's end user is; kept in the usage record (end_user), never sent to a worker.
    user = StrictCharField(required=False, allow_blank=True, allow_null=True, max_length=MAX_USER_LENGTH,
                           trim_whitespace=False)
    stream = serializers.BooleanField(default=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    # Extensions (vLLM's names).
    top_k = serializers.IntegerField(min_value=-1, required=False, allow_null=True)
    min_p = serializers.FloatField(min_value=0, max_value=1, required=False, allow_null=True)
    repetition_penalty = serializers.FloatField(min_value=0, max_value=10, required=False, allow_null=True)
    ignore_eos = serializers.BooleanField(required=False, allow_null=True)
    priority = serializers.IntegerField(required=False, allow_null=True)

    def validate_n(self, value):
        if value not in (None, 1):
            raise serializers.ValidationError("only n=1 is supported")
        return value

    def validate_top_p(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("must be greater than 0")
        return value

    def validate_repetition_penalty(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("must be greater than 0")
        return value

    def validate(self, attrs):
        for name in UNSUPPORTED:
            value = self.initial_data.get(name)
            if not (value in (None, False, [], {}) or (name == "best_of" and value == 1)):
                raise serializers.ValidationError({name: "is not supported"})
        fmt = self.initial_data.get("response_format")
        if fmt not in (None, {"type": "text"}):
            raise serializers.ValidationError({"response_format": "only {\"type\": \"text\"} is supported"})
        if attrs.get("stream_options") and not attrs.get("stream"):
            raise serializers.ValidationError({"stream_options": "is only allowed when stream is true"})
        return attrs


class ChatMessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant"])
    content = MessageContentField(allow_null=True, required=False)
    name = serializers.CharField(required=False)

    def validate(self, attrs):
        if attrs.get("content") is None and attrs["role"] != "assistant":
            raise serializers.ValidationError({"content": "is required"})
        return attrs
