"""What a request constrains its output to, as the engine's ``structured_outputs`` (engine/structured/spec.py).

=================================================== ==========================================
request                                             structured_outputs
=================================================== ==========================================
response_format {"type": "text"} or absent          none
response_format {"type": "json_object"}             {"json_object": true}
response_format {"type": "json_schema",             {"json": schema}
"json_schema": {"name", "schema", "strict"}}
structured_outputs (vLLM's extra) {"json" | "regex"  the same, checked here
| "choice" | "grammar" | "json_object": ...}
=================================================== ==========================================

The constraint is checked here with the engine's own compiler (llguidance, without a tokenizer),
so a schema it cannot enforce is a 400 naming the parameter and the unsupported keyword before
any worker sees it; the engine checks it again. Tool calls (webapp/openai_api/tool_calls.py) are
constrained the same way.
"""

from __future__ import annotations

import re

from rest_framework import serializers

from workers.schema import InvalidParameterError, structured_grammar

MAX_SCHEMA_NAME = 64  # OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
FORMAT_TYPES = ("text", "json_object", "json_schema")


def request_constraint(data: dict) -> dict | None:
    """The engine constraint of a request body's ``response_format`` / ``structured_outputs``,
    checked; None when the output is free. Raises ``serializers.ValidationError`` naming the field."""
    fmt, extra = data.get("response_format"), data.get("structured_outputs")
    spec = _response_format(fmt)
    param = "response_format"
    if extra is not None:
        if spec is not None:
            raise serializers.ValidationError(
                {"structured_outputs": "cannot be combined with a response_format other than text"})
        spec, param = extra, "structured_outputs"
    if spec is None:
        return None
    check(spec, param)
    return spec


def check(spec: dict, param: str) -> str:
    """The grammar of ``spec``; ValidationError on ``param`` when the engine cannot enforce it."""
    try:
        return structured_grammar(spec, param)
    except InvalidParameterError as exc:
        raise serializers.ValidationError({param: exc.message}) from exc


def _response_format(fmt: object) -> dict | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMAT_TYPES:
        raise serializers.ValidationError({"response_format": f"type must be one of {list(FORMAT_TYPES)}"})
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    body = fmt.get("json_schema")
    if not isinstance(body, dict):
        raise serializers.ValidationError({"response_format.json_schema": "is required, an object with name "
                                                                          "and schema"})
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise serializers.ValidationError({"response_format.json_schema.name": (
            f"is required: 1 to {MAX_SCHEMA_NAME} letters, digits, underscores or dashes")})
    if body.get("strict") not in (None, True, False):
        raise serializers.ValidationError({"response_format.json_schema.strict": "must be true or false"})
    schema = body.get("schema", {})
    if not isinstance(schema, dict):
        raise serializers.ValidationError({"response_format.json_schema.schema": "must be a JSON Schema object"})
    # strict or not, the output is held to the schema: that is what grammar decoding gives
    return {"json": schema}
