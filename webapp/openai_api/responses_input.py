"""OpenAI's Responses API request (``POST /v1/responses``) checked and turned into the internal
generation request (webapp/openai_api/dialect.py).

As OpenAI's API does, a parameter it does not know is refused ("Unknown parameter"); ones it
knows that Pagoda does not implement (built-in tools, images, reasoning, conversations) are
refused by name. Ranges are chat's.

================================ ===============================================================
Responses                        internal request (chat messages)
================================ ===============================================================
instructions                     a system message first (not carried to a continuation)
input: a string                  a user message
message items (user, system,     messages of that role (``input_text`` / ``output_text`` parts
developer, assistant)            joined)
function_call items              an assistant message's ``tool_calls``
function_call_output items       tool messages (``tool_call_id`` = ``call_id``)
previous_response_id             the stored conversation, before this input (``resolve``)
tools [{type: function, name,    tool_plan's functions; tool_choice none/auto/required/
description, parameters}]        {"type": "function", "name"}; parallel_tool_calls
text.format json_schema /        response_format, through the structured-output path
json_object
max_output_tokens                max_tokens
================================ ===============================================================
"""

from __future__ import annotations

from rest_framework import serializers

from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.constraints import request_constraint
from webapp.openai_api.serializers import (MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_MODEL_LENGTH, MAX_USER_LENGTH,
                                          OPENAI_MAX_TEMPERATURE, StrictCharField, limited)
from webapp.openai_api.tool_calls import tool_plan

KNOWN_UNSUPPORTED = ("conversation", "prompt", "reasoning", "top_logprobs", "max_tool_calls", "include",
                     "context_management", "prompt_cache_retention")
IGNORED = ("prompt_cache_key", "service_tier", "stream_options", "truncation", "safety_identifier")
MAX_METADATA = 16
ROLES = ("user", "system", "developer", "assistant")


class InputField(serializers.Field):
    """``input``: a string, or a list of message / function_call / function_call_output items."""

    json_schema = {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": MAX_MESSAGES,
                                                   "items": {"type": "object"}}]}

    def to_internal_value(self, data) -> list[dict]:
        if isinstance(data, str):
            return [{"type": "message", "role": "user", "content": data}]
        if not isinstance(data, list) or len(data) > MAX_MESSAGES:
            raise serializers.ValidationError(f"must be a string or a list of at most {MAX_MESSAGES} items")
        return [_item(item, i) for i, item in enumerate(data)]

    def to_representation(self, value):
        return value


def _string(item: dict, name: str, i: int, *, blank: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not (value or blank):
        raise serializers.ValidationError({i: {name: "is required, a string"}})
    return value


def _item(item: object, i: int) -> dict:
    if not isinstance(item, dict):
        raise serializers.ValidationError({i: "must be an object"})
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        if item.get("role") not in ROLES:
            raise serializers.ValidationError({i: {"role": f"must be one of {list(ROLES)}"}})
        return {"type": "message", "role": item["role"], "content": _content(item.get("content"), i)}
    if kind == "function_call":
        return {"type": "function_call", "call_id": _string(item, "call_id", i), "name": _string(item, "name", i),
                "arguments": _string(item, "arguments", i, blank=True)}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = _content(output, i, field="output")
        return {"type": "function_call_output", "call_id": _string(item, "call_id", i), "output": output}
    raise serializers.ValidationError({i: {"type": "only message, function_call and function_call_output items "
                                               "are supported"}})


def _content(content: object, i: int, field: str = "content") -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or len(content) > MAX_CONTENT_PARTS:
        raise serializers.ValidationError({i: {field: "must be a string or a list of text parts"}})
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text") or \
                not isinstance(part.get("text"), str):
            raise serializers.ValidationError({i: {field: "only input_text and output_text parts are supported"}})
    return "".join(p["text"] for p in content)


class FunctionToolSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["function"], error_messages={
        "invalid_choice": 'only function tools (type "function") are supported'})
    name = StrictCharField(max_length=64)
    description = StrictCharField(required=False, allow_blank=True, allow_null=True)
    parameters = serializers.DictField(required=False, allow_null=True)
    strict = serializers.BooleanField(required=False, allow_null=True)


class TextConfigSerializer(serializers.Serializer):
    format = serializers.DictField(required=False)
    verbosity = serializers.ChoiceField(choices=["low", "medium", "high"], required=False, allow_null=True)


class ResponseInputSerializer(serializers.Serializer):
    default_error_messages = {"invalid": "The request body must be a JSON object."}

    model = StrictCharField(max_length=MAX_MODEL_LENGTH)
    input = InputField()
    instructions = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
    max_output_tokens = limited("max_tokens")
    temperature = limited("temperature", high=OPENAI_MAX_TEMPERATURE)
    top_p = limited("top_p")
    tools = FunctionToolSerializer(many=True, required=False, max_length=128)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True)
    text = TextConfigSerializer(required=False, allow_null=True)
    store = serializers.BooleanField(required=False, allow_null=True)
    previous_response_id = StrictCharField(required=False, allow_null=True, max_length=64)
    background = serializers.BooleanField(required=False, allow_null=True)
    stream = serializers.BooleanField(required=False, allow_null=True)
    metadata = serializers.DictField(child=StrictCharField(max_length=512, allow_blank=True), required=False,
                                     allow_null=True)
    user = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=MAX_USER_LENGTH)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            for name, value in data.items():
                if name in KNOWN_UNSUPPORTED and value not in (None, [], {}):
                    raise serializers.ValidationError({name: "is not supported by this server"})
                if name not in self.fields and name not in IGNORED and name not in KNOWN_UNSUPPORTED:
                    raise serializers.ValidationError({name: f"Unknown parameter: '{name}'."})
        return super().to_internal_value(data)

    def validate_metadata(self, value):
        if value is not None and (len(value) > MAX_METADATA or any(len(k) > 64 for k in value)):
            raise serializers.ValidationError(f"at most {MAX_METADATA} pairs, keys of at most 64 characters")
        return value

    def validate(self, attrs):
        return internal_request(attrs)


def _structured(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    try:
        return request_constraint({"response_format": fmt})
    except serializers.ValidationError as exc:
        detail = {str(k).replace("response_format.json_schema", "text.format").replace("response_format",
                                                                                        "text.format"): v
                  for k, v in exc.detail.items()}
        raise serializers.ValidationError(detail) from exc


def _plan(attrs: dict):
    tools = [{"type": "function", "function": {k: v for k, v in (("name", t["name"]), ("description",
                                                                                    t.get("description")),
                                                                  ("parameters", t.get("parameters")))
                                               if v is not None}}
             for t in attrs.get("tools") or []]
    choice = attrs.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise serializers.ValidationError({"tool_choice": 'must be "none", "auto", "required" or '
                                                              '{"type": "function", "name": ...}'})
        choice = {"type": "function", "function": {"name": choice["name"]}}
    body = {"tools": tools, "tool_choice": choice}
    if attrs.get("parallel_tool_calls") is not None:
        body["parallel_tool_calls"] = attrs["parallel_tool_calls"]
    return tool_plan(body)


def internal_request(attrs: dict) -> dict:
    """The internal generation request of a checked body; ``previous_response_id`` is read later
    (``resolve``, with the database) and the conversation completed then."""
    plan = _plan(attrs)
    structured = _structured(attrs.get("text"))
    if plan is not None and plan.constraint is not None and structured is not None:
        raise serializers.ValidationError({"tool_choice": (
            "a required or named tool call cannot be combined with text.format")})
    fmt = (attrs.get("text") or {}).get("format") or {"type": "text"}
    echo = {"instructions": attrs.get("instructions"), "max_output_tokens": attrs.get("max_output_tokens"),
            "metadata": attrs.get("metadata") or {}, "parallel_tool_calls": attrs.get("parallel_tool_calls") is not False,
            "previous_response_id": attrs.get("previous_response_id"), "store": attrs.get("store") is not False,
            "background": bool(attrs.get("background")), "temperature": attrs.get("temperature"),
            "top_p": attrs.get("top_p"), "tool_choice": attrs.get("tool_choice") or "auto",
            "tools": [{"type": "function", "name": t["name"], "description": t.get("description"),
                       "parameters": t.get("parameters") or {"type": "object", "properties": {}},
                       "strict": t.get("strict") is not False} for t in attrs.get("tools") or []],
            "text": {"format": fmt}, "user": attrs.get("user")}
    values = {"model": attrs["model"], "input": attrs["input"], "tool_plan": plan, "structured_outputs":
              plan.constraint if plan is not None and plan.constraint is not None else structured,
              "max_tokens": attrs.get("max_output_tokens"), "stream": bool(attrs.get("stream")),
              "user": attrs.get("user") or "", "response": echo}
    for name in ("temperature", "top_p"):
        if attrs.get(name) is not None:
            values[name] = attrs[name]
    values["conversation"] = chat_messages(attrs["input"])
    values["messages"] = _with_instructions(attrs.get("instructions"), values["conversation"])
    return values


def _with_instructions(instructions: str | None, conversation: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": instructions}] if instructions else []) + conversation


def chat_messages(items: list[dict]) -> list[dict]:
    """Input items as chat messages: consecutive function calls join one assistant message."""
    out: list[dict] = []
    for item in items:
        if item["type"] == "message":
            out.append({"role": item["role"], "content": item["content"]})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out


def response_resolve(*, api_key: ApiKey, values: dict) -> dict:
    """The conversation a ``previous_response_id`` continues, put before this input (404 if the key's
    owner has no such response: another owner's is as unknown as one that never existed), and every
    ``function_call_output`` checked against the calls before it (400 naming an unknown call_id)."""
    from webapp.openai_api.models import StoredResponse

    previous_id = values["response"]["previous_response_id"]
    if previous_id:
        previous = StoredResponse.objects.filter(response_id=previous_id, owner_id=api_key.owner_id).first()
        if previous is None:
            raise errors.OpenAIError(404, f"Previous response with id '{previous_id}' not found.",
                                     param="previous_response_id", code="previous_response_not_found")
        values = {**values, "conversation": previous.messages + values["conversation"]}
        values["messages"] = _with_instructions(values["response"]["instructions"], values["conversation"])
    called: set[str] = set()
    for message in values["conversation"]:
        called.update(c["id"] for c in message.get("tool_calls") or [])
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise errors.invalid_parameter("input", "No tool call found for function call output with call_id "
                                                    f"{message['tool_call_id']}.")
    return values


def stored_conversation(values: dict, text: str, calls: list[dict]) -> list[dict]:
    """The conversation after this response: its input, then its output as one assistant message."""
    answer: dict = {"role": "assistant", "content": text}
    if calls:
        answer["tool_calls"] = [{"id": c["id"], "type": "function",
                                 "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return [*values["conversation"], answer]

