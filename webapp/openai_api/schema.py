"""The OpenAPI 3.1 document of the /v1 endpoints (GET v1/openapi.json), built from the views'
InputSerializers, so each parameter's published range is the one the API checks.

Clients and the fuzzing suite (tests/webapp/test_openai_api_fuzz.py) read it; an error of any
endpoint is the ``Error`` object, whatever its status, except on Anthropic's Messages routes,
whose errors are ``AnthropicError`` objects (and whose key may come as ``x-api-key``).
"""

from __future__ import annotations

from rest_framework import serializers

from webapp.openai_api.serializers import (MAX_CONTENT_PARTS, MAX_N, MAX_PROMPTS, MAX_SEQUENCES, LimitField,
                                          LogitBiasField, MessageContentField, PromptField, StopField, TOKEN_ID_LIMIT,
                                          TokenIdsField)

ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _string(max_length: int | None = None, min_length: int | None = None) -> dict:
    schema: dict = {"type": "string"}
    if max_length is not None:
        schema["maxLength"] = max_length
    if min_length:
        schema["minLength"] = min_length
    return schema


def _limit(field: LimitField) -> dict:
    limit = field.limit
    schema = {"type": "integer" if limit.kind is int else "number", "maximum": limit.high,
              "exclusiveMinimum" if limit.low_exclusive else "minimum": limit.low}
    return schema


def field_schema(field: serializers.Field) -> dict:
    """JSON Schema of one InputSerializer field (nullable when the field allows null)."""
    if hasattr(field, "json_schema"):  # a field of its own shape states it
        schema = dict(field.json_schema)
    elif isinstance(field, serializers.ListSerializer):
        schema = {"type": "array", "items": field_schema(field.child)}
        if not field.allow_empty:
            schema["minItems"] = 1
        if field.max_length is not None:
            schema["maxItems"] = field.max_length
    elif isinstance(field, serializers.Serializer):
        schema = object_schema(field)
    elif isinstance(field, LimitField):
        schema = _limit(field)
    elif isinstance(field, LogitBiasField):
        limit = field.limit
        schema = {"type": "object", "maxProperties": limit.max_items, "propertyNames": {"pattern": "^[0-9]{1,10}$"},
                  "additionalProperties": {"type": "number", "minimum": limit.low, "maximum": limit.high}}
    elif isinstance(field, TokenIdsField):
        schema = {"type": "array", "maxItems": field.limit.max_items,
                  "items": {"type": "integer", "minimum": field.limit.low, "maximum": field.limit.high}}
    elif isinstance(field, StopField):
        one = _string(field.limit.high)
        schema = {"anyOf": [one, {"type": "array", "maxItems": field.limit.max_items, "items": one}]}
    elif isinstance(field, MessageContentField):
        part = {"type": "object", "required": ["type", "text"],
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
        schema = {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": MAX_CONTENT_PARTS, "items": part}]}
    elif isinstance(field, PromptField):
        ids = {"type": "array", "minItems": 1,
               "items": {"type": "integer", "minimum": TOKEN_ID_LIMIT.low, "maximum": TOKEN_ID_LIMIT.high}}
        text = _string(min_length=1)
        schema = {"anyOf": [text, ids, {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": text},
                            {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": ids}],
                  "description": f"One prompt, or a list of up to {MAX_PROMPTS} (strings or token-id lists); "
                                 f"prompts x max(n, best_of) at most {MAX_SEQUENCES}. Choices come prompt by "
                                 "prompt: index = prompt index x n + sample index."}
    elif isinstance(field, serializers.ChoiceField):
        schema = {"type": "string", "enum": list(field.choices)}
    elif isinstance(field, serializers.BooleanField):
        schema = {"type": "boolean"}
    elif isinstance(field, serializers.IntegerField):  # n, best_of: samples per prompt
        schema = {"type": "integer", "minimum": 1, "maximum": MAX_N}
    elif isinstance(field, serializers.CharField):
        schema = _string(field.max_length, 0 if field.allow_blank else 1)
    elif isinstance(field, serializers.DictField):
        schema = {"type": "object"}
    else:
        schema = {}
    if field.allow_null and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    elif field.allow_null:
        schema = {"anyOf": [schema, {"type": "null"}]}
    if field.help_text:
        schema["description"] = str(field.help_text)
    return schema


def object_schema(serializer: serializers.Serializer) -> dict:
    fields = serializer.fields
    schema = {"type": "object", "properties": {name: field_schema(f) for name, f in fields.items()}}
    required = [name for name, f in fields.items() if f.required]
    if required:
        schema["required"] = required
    return schema


def _errors_only(description: str, error: str = "Error") -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}}}


def _operation(summary: str, operation_id: str, ok: dict, body: dict | None = None,
               parameters: list | None = None, anthropic: bool = False) -> dict:
    security = [{"anthropic": []}, {"bearer": []}] if anthropic else [{"bearer": []}]
    error = _errors_only("An Anthropic error object", "AnthropicError") if anthropic else \
        _errors_only("An OpenAI error object")
    operation = {"summary": summary, "operationId": operation_id, "security": security,
                 "responses": {"200": ok, "default": error}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if parameters:
        operation["parameters"] = parameters
    return operation


def openapi_document(operations: dict[str, tuple[str, type[serializers.Serializer]]],
                     anthropic_paths: frozenset[str] = frozenset()) -> dict:
    """The document; ``operations`` maps each POST path to (operationId, its view's InputSerializer);
    ``anthropic_paths`` answer Anthropic's errors."""
    obj = {"type": "object"}
    completion_ok = {"description": "The answer, or its stream of server-sent events when stream is true",
                     "content": {"application/json": {"schema": obj}, "text/event-stream": {"schema": {"type": "string"}}}}
    response_id = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    stored = {"description": "The stored response", "content": {"application/json": {"schema": obj}}}
    paths = {
        "/v1/models": {"get": _operation("The served models this key may use", "listModels",
                                         {"description": "A list of models", "content": {"application/json": {"schema": obj}}})},
        "/v1/models/{model}": {"get": _operation(
            "One served model", "retrieveModel", {"description": "The model", "content": {"application/json": {"schema": obj}}},
            parameters=[{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}])},
        "/v1/responses/{response_id}": {
            "get": _operation("A stored response of this key's owner", "getResponse", stored, parameters=response_id),
            "delete": _operation("Delete a stored response", "deleteResponse", stored, parameters=response_id)},
        "/v1/responses/{response_id}/cancel": {"post": _operation(
            "Cancel a background response", "cancelResponse", stored, parameters=response_id)},
    }
    embedding_ok = {"description": "One embedding per input", "content": {"application/json": {"schema": obj}}}
    for path, (name, serializer) in operations.items():
        ok = embedding_ok if path.endswith("/embeddings") else completion_ok
        paths[path] = {"post": _operation(name, name, ok, body=object_schema(serializer()),
                                          anthropic=path in anthropic_paths)}
    return {"openapi": "3.1.0",
            "info": {"title": "Pagoda OpenAI- and Anthropic-compatible API", "version": "1"},
            "paths": paths,
            "components": {"schemas": {"Error": ERROR, "AnthropicError": ANTHROPIC_ERROR},
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                               "anthropic": {"type": "apiKey", "in": "header", "name": "x-api-key"}}}}
