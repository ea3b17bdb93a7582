"""What a request may constrain its output to, turned into an llguidance grammar; torch-free.

``SamplingParams.structured_outputs`` is a dict with exactly one of these keys (vLLM's names):

=============== ========================= ===============================================
key             value                     the output
=============== ========================= ===============================================
json            a JSON Schema (an object  one JSON value valid against the schema
                or its JSON text)
json_object     true                      one JSON object (any keys)
regex           a regular expression      a string the expression matches in full
choice          a list of strings         exactly one of them
grammar         a Lark grammar            a string of the grammar's language
=============== ========================= ===============================================

JSON is written without free whitespace (``", "`` and ``": "`` as separators), so that a model
cannot loop on spaces. A schema keyword llguidance does not implement (``uniqueItems``, ``not``,
``if``...) is refused with its name, never ignored: the output would not be what was asked.
"""

from __future__ import annotations

import json

from engine.errors import InvalidParameterError

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 256 * 1024  # a schema's JSON text; compiling is linear-ish in it
MAX_CHOICES = 1024
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def structured_grammar(spec: object, param: str = "structured_outputs") -> str:
    """The llguidance grammar of ``spec``, checked (without a tokenizer); raises
    ``InvalidParameterError`` naming ``param`` and what is wrong or unsupported."""
    from llguidance import LLMatcher

    if not isinstance(spec, dict):
        raise InvalidParameterError(param, "must be an object with one of the keys " + ", ".join(KINDS))
    keys = [k for k in KINDS if spec.get(k) not in (None, False)]
    unknown = sorted(set(spec) - set(KINDS))
    if unknown:
        raise InvalidParameterError(param, f"unknown key {unknown[0]!r}; known: {', '.join(KINDS)}")
    if len(keys) != 1:
        raise InvalidParameterError(param, "exactly one of " + ", ".join(KINDS) + " must be set")
    kind, value = keys[0], spec[keys[0]]
    try:
        grammar = _grammar(kind, value, param)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # llguidance's own refusals
        if isinstance(exc, InvalidParameterError):
            raise
        raise InvalidParameterError(param, f"cannot be enforced: {_first_line(str(exc))}") from exc
    error = LLMatcher.validate_grammar(grammar, None)
    if error:
        raise InvalidParameterError(param, f"cannot be enforced: {_first_line(error)}")
    return grammar


def _grammar(kind: str, value: object, param: str) -> str:
    from llguidance import LLMatcher

    if kind == "json":
        schema = _schema(value, param)
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    elif kind == "json_object":
        if value is not True:
            raise InvalidParameterError(param, "json_object must be true")
        grammar = LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    elif kind == "regex":
        grammar = LLMatcher.grammar_from_regex(_text(value, param, kind))
    elif kind == "choice":
        if (not isinstance(value, list) or not value or len(value) > MAX_CHOICES
                or not all(isinstance(c, str) and c for c in value)):
            raise InvalidParameterError(param, f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
        if sum(len(c) for c in value) > MAX_SPEC_CHARS:
            raise InvalidParameterError(param, f"choice is longer than {MAX_SPEC_CHARS} characters")
        # JSON string literals are Lark string literals
        grammar = LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    else:
        grammar = LLMatcher.grammar_from_lark(_text(value, param, kind))
    return grammar


def _schema(value: object, param: str) -> dict:
    if isinstance(value, str):
        if len(value) > MAX_SPEC_CHARS:
            raise InvalidParameterError(param, f"the schema is longer than {MAX_SPEC_CHARS} characters")
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidParameterError(param, f"the schema is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidParameterError(param, "the schema must be a JSON object")
    if len(json.dumps(value)) > MAX_SPEC_CHARS:
        raise InvalidParameterError(param, f"the schema is longer than {MAX_SPEC_CHARS} characters")
    return value


def _text(value: object, param: str, kind: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidParameterError(param, f"{kind} must be a non-empty string")
    if len(value) > MAX_SPEC_CHARS:
        raise InvalidParameterError(param, f"{kind} is longer than {MAX_SPEC_CHARS} characters")
    return value


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else message
    return line if len(line) <= 300 else line[:297] + "..."
