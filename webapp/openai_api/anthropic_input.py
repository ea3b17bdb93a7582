"""Anthropic's Messages API request (``POST /v1/messages`` and ``/v1/messages/count_tokens``) checked
and turned into the internal generation request (webapp/openai_api/dialect.py).

As Anthropic's API does, ``max_tokens`` is required (count_tokens excepted) and a field it does
not know is refused ("Extra inputs are not permitted"); fields it knows that Pagoda does not
implement (images, thinking, server tools) are refused by name. The anthropic package (2.x) no
longer offers ``temperature``, ``top_p`` and ``top_k`` as arguments; they are accepted here (its
clients pass them in ``extra_body``), as the API reference still lists them. Ranges are chat's (the engine's),
``temperature`` narrowed to Anthropic's 0..1.

================================ ===============================================================
Messages                         internal request (chat messages)
================================ ===============================================================
system (string or text blocks)   a system message
user text blocks                 a user message (the blocks' texts joined)
user tool_result blocks          tool messages (``tool_call_id`` = ``tool_use_id``), in order
assistant text + tool_use blocks an assistant message with ``tool_calls`` (input as JSON text)
tools [{name, description,       tool_plan's functions (``parameters`` = ``input_schema``)
input_schema}]
tool_choice auto/any/tool/none   auto / required / named / none; ``disable_parallel_tool_use``
                                 is ``parallel_tool_calls: false``
stop_sequences, temperature,     stop, temperature, top_p, top_k, max_tokens
top_p, top_k, max_tokens
metadata.user_id                 user (the usage record's end user)
================================ ===============================================================
"""

from __future__ import annotations

import json

from rest_framework import serializers

from webapp.openai_api.serializers import (MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_MODEL_LENGTH, MAX_TOOL_CALL_ID,
                                          MAX_USER_LENGTH, StopField, StrictCharField, limited)
from webapp.openai_api.tool_calls import tool_plan

KNOWN_UNSUPPORTED = ("thinking", "container", "mcp_servers", "context_management", "output_format", "output_config")
# Known, and without effect here: caching is automatic (the prefix cache), there is one tier and place.
IGNORED = ("cache_control", "service_tier", "inference_geo", "speed", "diagnostics", "workspace_id",
           "user_profile_id")
MAX_ANTHROPIC_TEMPERATURE = 1.0
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_TEXT = {"type": "object", "required": ["type", "text"],
         "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}


def _text_of(blocks: object, where: str) -> str:
    """A string, or text blocks joined (system prompts, tool results)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list) or len(blocks) > MAX_CONTENT_PARTS:
        raise serializers.ValidationError({where: f"must be a string or a list of at most {MAX_CONTENT_PARTS} "
                                                  "text blocks"})
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise serializers.ValidationError({f"{where}.{i}": "only text blocks are supported here"})
    return "".join(b["text"] for b in blocks)


class SystemField(serializers.Field):
    json_schema = {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": MAX_CONTENT_PARTS, "items": _TEXT}]}

    def to_internal_value(self, data) -> str:
        return _text_of(data, "system")

    def to_representation(self, value):
        return value


class ContentField(serializers.Field):
    """A message's content: a string or content blocks (text, tool_use, tool_result)."""

    json_schema = {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": MAX_CONTENT_PARTS,
                                                   "items": {"type": "object", "required": ["type"]}}]}

    def to_internal_value(self, data) -> list[dict]:
        if isinstance(data, str):
            return [{"type": "text", "text": data}]
        if not isinstance(data, list) or len(data) > MAX_CONTENT_PARTS:
            raise serializers.ValidationError(f"must be a string or a list of at most {MAX_CONTENT_PARTS} "
                                              "content blocks")
        return [_block(block, i) for i, block in enumerate(data)]

    def to_representation(self, value):
        return value


def _block(block: object, i: int) -> dict:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "tool_use":
        if not isinstance(block.get("id"), str) or not block["id"] or len(block["id"]) > MAX_TOOL_CALL_ID:
            raise serializers.ValidationError({i: {"id": "is required, a string"}})
        if not isinstance(block.get("name"), str) or not block["name"]:
            raise serializers.ValidationError({i: {"name": "is required, a string"}})
        if not isinstance(block.get("input"), dict):
            raise serializers.ValidationError({i: {"input": "is required, an object"}})
        return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": block["input"]}
    if kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
            raise serializers.ValidationError({i: {"tool_use_id": "is required, a string"}})
        if block.get("is_error") not in (None, True, False):
            raise serializers.ValidationError({i: {"is_error": "must be true or false"}})
        text = _text_of(block.get("content", ""), f"{i}.content")
        return {"type": "tool_result", "tool_use_id": block["tool_use_id"], "text": text,
                "is_error": bool(block.get("is_error"))}
    if kind == "text":
        raise serializers.ValidationError({i: {"text": "is required, a string"}})
    raise serializers.ValidationError({i: {"type": "only text, tool_use and tool_result blocks are supported"}})


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["user", "assistant"],
                                   error_messages={"invalid_choice": 'must be "user" or "assistant"'})
    content = ContentField()


class ToolSerializer(serializers.Serializer):
    name = StrictCharField(max_length=64)
    description = StrictCharField(required=False, allow_blank=True)
    input_schema = serializers.DictField()
    type = StrictCharField(required=False, allow_null=True)  # "custom" (client tools) only

    def validate_type(self, value):
        if value not in (None, "custom"):
            raise serializers.ValidationError("only client tools (custom) are supported")
        return value


class ToolChoiceSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["auto", "any", "tool", "none"])
    name = StrictCharField(required=False, max_length=64)
    disable_parallel_tool_use = serializers.BooleanField(required=False)


class MetadataSerializer(serializers.Serializer):
    user_id = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=MAX_USER_LENGTH)


class CountTokensInputSerializer(serializers.Serializer):
    """POST v1/messages/count_tokens: the request without max_tokens."""

    default_error_messages = {"invalid": "The request body must be a JSON object."}

    model = StrictCharField(max_length=MAX_MODEL_LENGTH)
    messages = MessageSerializer(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    system = SystemField(required=False)
    tools = ToolSerializer(many=True, required=False, max_length=128)
    tool_choice = ToolChoiceSerializer(required=False)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            for name, value in data.items():
                if name in KNOWN_UNSUPPORTED and value is not None:
                    raise serializers.ValidationError({name: "is not supported by this server"})
                if name not in self.fields and name not in IGNORED and name not in KNOWN_UNSUPPORTED:
                    raise serializers.ValidationError({name: "Extra inputs are not permitted"})
        return super().to_internal_value(data)

    def validate(self, attrs):
        return internal_request(attrs)


class MessagesInputSerializer(CountTokensInputSerializer):
    """POST v1/messages."""

    max_tokens = limited("max_tokens", required=True, allow_null=False)
    stop_sequences = StopField(required=False)
    temperature = limited("temperature", high=MAX_ANTHROPIC_TEMPERATURE)
    top_p = limited("top_p")
    top_k = limited("top_k")
    stream = serializers.BooleanField(default=False)
    metadata = MetadataSerializer(required=False)


def internal_request(attrs: dict) -> dict:
    """The internal generation request of a checked Messages body."""
    messages = [{"role": "system", "content": attrs["system"]}] if attrs.get("system") else []
    called: set[str] = set()
    for i, message in enumerate(attrs["messages"]):
        messages += _chat_messages(message, i, called)
    plan = tool_plan(_openai_tools(attrs))
    values = {"model": attrs["model"], "messages": messages, "tool_plan": plan,
              "structured_outputs": plan.constraint if plan is not None else None}
    if "max_tokens" in attrs:
        values.update(max_tokens=attrs["max_tokens"], stream=attrs.get("stream", False),
                      user=(attrs.get("metadata") or {}).get("user_id") or "")
        for name, target in (("stop_sequences", "stop"), ("temperature", "temperature"), ("top_p", "top_p"),
                             ("top_k", "top_k")):
            if attrs.get(name) is not None:
                values[target] = attrs[name]
    return values


def _chat_messages(message: dict, i: int, called: set[str]) -> list[dict]:
    blocks = message["content"]
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    if message["role"] == "assistant":
        if any(b["type"] == "tool_result" for b in blocks):
            raise serializers.ValidationError({f"messages.{i}.content": "tool_result blocks belong in user messages"})
        calls = [{"id": b["id"], "type": "function",
                  "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}}
                 for b in blocks if b["type"] == "tool_use"]
        called.update(c["id"] for c in calls)
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    if any(b["type"] == "tool_use" for b in blocks):
        raise serializers.ValidationError({f"messages.{i}.content": "tool_use blocks belong in assistant messages"})
    out = []
    for block in blocks:
        if block["type"] != "tool_result":
            continue
        if block["tool_use_id"] not in called:
            raise serializers.ValidationError({f"messages.{i}.content": (
                f"tool_result block has an unknown tool_use_id {block['tool_use_id']!r}: it must answer a tool_use "
                "block of an earlier assistant message")})
        content = ("Error: " if block["is_error"] else "") + block["text"]
        out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
    if text or not out:
        out.append({"role": "user", "content": text})
    return out


def _openai_tools(attrs: dict) -> dict:
    """tools / tool_choice as tool_plan reads them (chat's shape)."""
    tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                               **({"description": t["description"]} if t.get("description") else {})}}
             for t in attrs.get("tools") or []]
    choice = attrs.get("tool_choice")
    body: dict = {"tools": tools}
    if choice is not None:
        if choice["type"] == "tool":
            if not choice.get("name"):
                raise serializers.ValidationError({"tool_choice.name": 'is required when type is "tool"'})
            body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            body["tool_choice"] = TOOL_CHOICES[choice["type"]]
        body["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use", False)
        if not tools and choice["type"] == "none":
            body.pop("tool_choice")
    return body
