"""The fields and parameters both completion endpoints validate; each API view's own InputSerializer
(webapp/openai_api/views.py) adds what is particular to it.

Every number and list has a range, refused with a 400 naming the parameter. The sampling ranges
are the engine's own (``engine.sampling_params.SAMPLING_LIMITS``, read here, never copied), some
narrowed to OpenAI's (temperature 0..2) so that a request that passes here means what it means
there; the engine re-validates what it receives. The rest are this API's:

==================== ====================================== =====================================
parameter            range                                  source
==================== ====================================== =====================================
model                a string of at most 200 characters     UsageRecord.model_name
max_tokens,          1 .. 2**31-1                           engine
max_completion_tokens
temperature          0 .. 2                                 OpenAI (engine: 0 .. 100)
top_p                (0, 1]                                 engine
top_k                -1 .. 2**31-1 (-1 and 0 disable)       engine
min_p                0 .. 1                                 engine
repetition_penalty   (0, 10]                                engine
presence_penalty,    -2 .. 2                                engine (= OpenAI)
frequency_penalty
seed                 -2**63 .. 2**64-1                      engine
logit_bias           <= 1024 {"token id": -100 .. 100}      engine (= OpenAI), ids < vocabulary
min_tokens           0 .. 2**31-1, <= max_tokens            engine (vLLM's extra)
stop_token_ids       <= 256 token ids                       engine (vLLM's extra)
stop                 a string or <= 16 strings, each        engine
                     <= 1024 characters
logprobs (completions), top_logprobs (chat)  0 .. 20        engine
n                    1 .. MAX_N (16)                        choices, sharing the prompt's KV blocks
priority             -2**31 .. 2**31-1                      int32
user                 a string of at most 256 characters     UsageRecord.end_user
messages             1 .. 2048 messages                     OpenAI's cap
messages[].name      at most 64 characters                  OpenAI
messages[].content   a string or <= 2048 text parts
prompt               a non-empty string or 1 .. 2**31-1     engine (ids also below the vocabulary)
                     token ids, each 0 .. 2**31-1; or a
                     list of 1 .. MAX_PROMPTS (16) of them  one engine request each (views.py)
prompts x max(n,     at most MAX_SEQUENCES (64)             the sequences one request runs at once,
best_of)                                                    the engine's own per-request bound
==================== ====================================== =====================================

The body itself (webapp/openai_api/body.py): JSON nested at most 32 levels deep, valid Unicode.
"""

from __future__ import annotations

import dataclasses

from rest_framework import serializers

from webapp.openai_api.constraints import request_constraint
from workers.schema import MAX_INT32, SAMPLING_LIMITS, Limit

MAX_LOGPROBS = SAMPLING_LIMITS["logprobs"].high
MAX_STOP_STRINGS = SAMPLING_LIMITS["stop"].max_items
MAX_MODEL_LENGTH = 200  # UsageRecord.model_name holds it
MAX_USER_LENGTH = 256  # UsageRecord.end_user holds it
MAX_MESSAGES = 2048
MAX_NAME_LENGTH = 64
MAX_N = 16  # choices per request: each is a sequence in the engine's batch (engine allows 64)
MAX_PROMPTS = 16  # prompts of one /v1/completions request, each its own engine request
MAX_SEQUENCES = 64  # prompts x max(n, best_of): the sequences one request may run at once
MAX_CONTENT_PARTS = 2048
MAX_TOOLS = 128  # OpenAI's cap, also on an assistant message's tool calls
MAX_TOOL_CALL_ID = 256
OPENAI_MAX_TEMPERATURE = 2.0
PRIORITY_LIMIT = Limit(int, -MAX_INT32 - 1, MAX_INT32)
TOKEN_ID_LIMIT = SAMPLING_LIMITS["stop_token_ids"]  # 0 .. 2**31-1 per id
# OpenAI parameters we do not implement: refused when set, so that nobody silently gets less.
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "best_of", "suffix",
               "echo", "audio", "modalities", "prediction", "web_search_options")


class LimitField(serializers.Field):
    """A number inside a ``Limit`` (an engine limit, or a narrower ``high``); JSON numbers only,
    never strings or booleans, as OpenAI's API does."""

    default_error_messages = {"invalid": "must be {what}"}

    def __init__(self, limit: Limit, *, high: int | float | None = None, **kwargs):
        if high is not None:
            limit = dataclasses.replace(limit, high=min(high, limit.high))
        self.limit = limit
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)

    def to_internal_value(self, data) -> int | float:
        if not self.limit.allows(data):
            self.fail("invalid", what=self.limit.describe())
        return float(data) if self.limit.kind is float else data

    def to_representation(self, value):
        return value


def limited(name: str, **kwargs) -> LimitField:
    """The field for the engine's sampling parameter ``name``, within its published limit."""
    return LimitField(SAMPLING_LIMITS[name], **kwargs)


class LogitBiasField(serializers.Field):
    """OpenAI's logit_bias: {"token id": bias}, biases within the engine's range; ids below the
    model's vocabulary are checked with its tokenizer (services), and again by the engine."""

    limit = SAMPLING_LIMITS["logit_bias"]
    default_error_messages = {
        "invalid": "must be an object mapping token ids to biases",
        "too_many": f"at most {limit.max_items} entries",
        "key": f"keys must be token ids (integers from 0 to {MAX_INT32})",
        "value": f"biases must be {limit.describe()}"}

    def to_internal_value(self, data) -> dict[int, float]:
        if not isinstance(data, dict):
            self.fail("invalid")
        if len(data) > self.limit.max_items:
            self.fail("too_many")
        bias = {}
        for key, value in data.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10
                    and int(key) <= MAX_INT32):
                self.fail("key")
            if not self.limit.allows(value):
                self.fail("value")
            bias[int(key)] = float(value)
        return bias

    def to_representation(self, value):
        return value


class TokenIdsField(serializers.Field):
    """stop_token_ids: at most 256 token ids."""

    limit = SAMPLING_LIMITS["stop_token_ids"]
    default_error_messages = {"invalid": f"must be a list of at most {limit.max_items} token ids "
                                         f"(integers from 0 to {limit.high})"}

    def to_internal_value(self, data) -> list[int]:
        if not isinstance(data, list) or len(data) > self.limit.max_items or not all(
                self.limit.allows(t) for t in data):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class StopField(serializers.Field):
    limit = SAMPLING_LIMITS["stop"]
    default_error_messages = {"invalid": "must be a string or a list of strings",
                              "too_many": f"at most {limit.max_items} stop sequences",
                              "too_long": f"each stop sequence must be at most {limit.high} characters"}

    def to_internal_value(self, data) -> list[str]:
        stops = [data] if isinstance(data, str) else data
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            self.fail("invalid")
        if len(stops) > self.limit.max_items:
            self.fail("too_many")
        if any(not self.limit.allows(len(s)) for s in stops):
            self.fail("too_long")
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
                              "too_many": f"at most {MAX_CONTENT_PARTS} content parts",
                              "not_text": "only text content parts are supported by this model"}

    def to_internal_value(self, data) -> str:
        if isinstance(data, str):
            return data
        if not isinstance(data, list) or not all(isinstance(p, dict) for p in data):
            self.fail("invalid")
        if len(data) > MAX_CONTENT_PARTS:
            self.fail("too_many")
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in data):
            self.fail("not_text")
        return "".join(p["text"] for p in data)

    def to_representation(self, value):
        return value


class PromptField(serializers.Field):
    """The prompts of a completion, always returned as a list of 1 .. MAX_PROMPTS prompts, each a
    non-empty string or a non-empty list of token ids. As OpenAI takes them: a string, a list of
    token ids (one prompt), or a list of strings / of token-id lists (one prompt each)."""

    default_error_messages = {"invalid": "must be a string, a list of token ids (integers from 0 to "
                                         f"{TOKEN_ID_LIMIT.high}), or a list of up to {MAX_PROMPTS} "
                                         "of either",
                              "many": f"at most {MAX_PROMPTS} prompts per request",
                              "empty": "must not be empty"}

    def to_internal_value(self, data) -> list[str | list[int]]:
        if isinstance(data, list) and data and isinstance(data[0], (str, list)):
            if len(data) > MAX_PROMPTS:
                self.fail("many")
            return [self._one(item) for item in data]
        return [self._one(data)]

    def _one(self, data) -> str | list[int]:
        if isinstance(data, str):
            if not data:
                self.fail("empty")
            return data
        if isinstance(data, list) and all(TOKEN_ID_LIMIT.allows(t) for t in data):
            if not data:
                self.fail("empty")
            return data
        self.fail("invalid")

    def to_representation(self, value):
        return value


def prompt_list(prompt) -> list[str | list[int]]:
    """A completion's ``prompt`` as the list PromptField validates it to (a single one listed)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return prompt
    return [prompt]


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(default=False)


class SamplingInputSerializer(serializers.Serializer):
    """The parameters both endpoints share."""

    default_error_messages = {"invalid": "The request body must be a JSON object."}

    model = StrictCharField(max_length=MAX_MODEL_LENGTH)
    max_tokens = limited("max_tokens")
    temperature = limited("temperature", high=OPENAI_MAX_TEMPERATURE)
    top_p = limited("top_p")
    n = serializers.IntegerField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    seed = limited("seed")
    presence_penalty = limited("presence_penalty")
    frequency_penalty = limited("frequency_penalty")
    # Who the caller's end user is; kept in the usage record (end_user), never sent to a worker.
    user = StrictCharField(required=False, allow_blank=True, allow_null=True, max_length=MAX_USER_LENGTH,
                           trim_whitespace=False)
    stream = serializers.BooleanField(default=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    # Extensions (vLLM's names).
    top_k = limited("top_k")
    min_p = limited("min_p")
    repetition_penalty = limited("repetition_penalty")
    ignore_eos = serializers.BooleanField(required=False, allow_null=True)
    priority = LimitField(PRIORITY_LIMIT)
    min_tokens = limited("min_tokens")
    stop_token_ids = TokenIdsField(required=False, allow_null=True)
    logit_bias = LogitBiasField(required=False, allow_null=True)

    def validate_n(self, value):
        if value is not None and not 1 <= value <= MAX_N:
            raise serializers.ValidationError(f"must be from 1 to {MAX_N}")
        return value

    unsupported = UNSUPPORTED  # the chat endpoint takes tools

    def validate(self, attrs):
        for name in self.unsupported:
            value = self.initial_data.get(name)
            if not (value in (None, False, [], {}) or (name == "best_of" and value == 1)):
                raise serializers.ValidationError({name: "is not supported"})
        # response_format / structured_outputs as the engine's constraint (webapp/openai_api/constraints.py)
        attrs["structured_outputs"] = request_constraint(self.initial_data)
        if attrs.get("stream_options") and not attrs.get("stream"):
            raise serializers.ValidationError({"stream_options": "is only allowed when stream is true"})
        return attrs


class ToolCallFunctionSerializer(serializers.Serializer):
    name = StrictCharField(max_length=MAX_NAME_LENGTH)
    arguments = StrictCharField(allow_blank=True, trim_whitespace=False)  # JSON text, as OpenAI sends it


class ToolCallSerializer(serializers.Serializer):
    """A call in an assistant message of the history."""

    id = StrictCharField(max_length=MAX_TOOL_CALL_ID)
    type = serializers.ChoiceField(choices=["function"], error_messages={"invalid_choice": 'must be "function"'})
    function = ToolCallFunctionSerializer()


class ChatMessageSerializer(serializers.Serializer):
    ROLES = ["system", "developer", "user", "assistant", "tool"]

    role = serializers.ChoiceField(choices=ROLES, error_messages={"invalid_choice": f"must be one of {ROLES}"})
    content = MessageContentField(allow_null=True, required=False)
    name = StrictCharField(required=False, max_length=MAX_NAME_LENGTH)
    tool_calls = ToolCallSerializer(many=True, required=False, allow_empty=False, max_length=MAX_TOOLS)
    tool_call_id = StrictCharField(required=False, max_length=MAX_TOOL_CALL_ID)

    def validate(self, attrs):
        role = attrs["role"]
        if attrs.get("content") is None and role != "assistant":
            raise serializers.ValidationError({"content": "is required"})
        if attrs.get("tool_calls") and role != "assistant":
            raise serializers.ValidationError({"tool_calls": "only assistant messages carry tool calls"})
        if role == "tool" and not attrs.get("tool_call_id"):
            raise serializers.ValidationError({"tool_call_id": "is required in a tool message"})
        return attrs


def check_tool_messages(messages: list[dict]) -> None:
    """A tool message answers a call of an earlier assistant message (OpenAI's rule)."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        called.update(c["id"] for c in message.get("tool_calls") or [])
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise serializers.ValidationError({f"messages[{i}].tool_call_id": (
                "must answer a tool call of an earlier assistant message (its id)")})
