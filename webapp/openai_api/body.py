"""Reading JSON from a client, refusing what would hurt the server later: the API's request bodies,
and through ``json_read`` the Batch API's lines, the chat's WebSocket frames and the console's
engine settings, so that a value refused in one is refused in all.

A hostile body fails here, before admission, as a 400 OpenAI error naming the field where there is
one: JSON that is not valid, nested deeper than MAX_JSON_DEPTH (the JSON parser's own recursion
would end in a RecursionError at about a thousand levels), holding a string that is not valid
Unicode (a lone surrogate such as ``"\\ud800"`` parses, but no database, tokenizer or log can store
it) or that holds a NUL character (``"\\u0000"``: PostgreSQL's text cannot hold it), or a number no
field can hold: an integer outside -2**63 .. 2**64-1 (the widest range a field takes: ``seed``'s),
a number too large for a float (``1e400``, which Python reads as infinity), or the literals ``NaN``,
``Infinity`` and ``-Infinity`` (Python's json accepts them; JSON has no such numbers). Those numbers
are caught by the parser's own hooks, which leave a marker for the walk to name where it stands, so
no field's code ever sees them: a float field comparing a 401-digit integer raised OverflowError, a
500. The walk is iterative, so no body can make it recurse.
"""

from __future__ import annotations

import json
import math

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from rest_framework.parsers import BaseParser

from webapp.openai_api import errors

MAX_JSON_DEPTH = 32  # an OpenAI request needs about 5 (messages[].content[].text)
MIN_INTEGER, MAX_INTEGER = -2**63, 2**64 - 1  # seed's range, the widest of any field
MAX_INTEGER_DIGITS = len(str(MAX_INTEGER))  # longer literals are refused unread (int() is quadratic)
NUMBER_RANGE = "integers from -2**63 to 2**64-1, other numbers within about ±1.8e308"


class JsonInputError(ValueError):
    """What is wrong with a JSON text: ``param`` the path of the value ("messages[1].content"; None
    for the whole text) and ``problem`` what is wrong with it, as in "is not valid JSON"."""

    def __init__(self, param: str | None, problem: str, *, message: str | None = None, is_syntax: bool = False):
        super().__init__(problem)
        self.param, self.problem, self._message = param, problem, message
        self.is_syntax = is_syntax  # not JSON at all (or nested past the parser's recursion)

    @property
    def message(self) -> str:
        """The sentence an API client reads."""
        if self._message is not None:
            return self._message
        return f"Invalid value for {self.param!r}: {self.problem}." if self.param else f"The request body {self.problem}."


class _Unreadable:
    """A number literal no field can hold, left by the parser's hooks for the walk to refuse."""

    __slots__ = ("problem",)

    def __init__(self, problem: str):
        self.problem = problem


def _parse_int(text: str):
    if len(text) - text.startswith("-") > MAX_INTEGER_DIGITS:
        return _Unreadable(f"is an integer too large ({NUMBER_RANGE})")
    value = int(text)
    return value if MIN_INTEGER <= value <= MAX_INTEGER else _Unreadable(f"is an integer too large ({NUMBER_RANGE})")


def _parse_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _Unreadable(f"is a number too large ({NUMBER_RANGE})")


def _parse_constant(text: str):  # NaN, Infinity, -Infinity
    return _Unreadable(f"is {text}, which is not a JSON number")


def json_read(raw: bytes | str, *, check_text: bool = True):
    """``raw`` as a JSON value (any: the caller says which it wants); JsonInputError if it is not
    one or holds a number no field can hold. ``check_text`` also refuses strings that are not
    valid Unicode or hold NUL, and nesting deeper than MAX_JSON_DEPTH."""
    try:
        data = json.loads(raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except RecursionError:
        error = _too_deep(None)
        error.is_syntax = True
        raise error from None
    except ValueError:  # also UnicodeDecodeError: bytes that are not UTF-8
        raise JsonInputError(None, "is not valid JSON", message="We could not parse the JSON body of your request.",
                             is_syntax=True) from None
    _check(data, check_text)
    return data


def body_parse(request: HttpRequest):
    """The body as a JSON value (not necessarily an object: the InputSerializer says so); OpenAIError if not."""
    try:
        return json_read(request.body)
    except RequestDataTooBig:
        raise errors.OpenAIError(413, "The request body is too large.", code="request_too_large") from None
    except JsonInputError as exc:
        raise from_json_input_error(exc) from None


class JsonBodyParser(BaseParser):
    """The DRF views' JSON parser (OpenAIApiView's), reading as ``body_parse`` does."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return json_read(stream.read())
        except JsonInputError as exc:
            raise from_json_input_error(exc) from None


def from_json_input_error(exc: JsonInputError) -> errors.OpenAIError:
    """400 invalid_parameter naming the field (None: the body as a whole)."""
    return errors.invalid_parameter(exc.param, exc.message)


def _check(data, check_text: bool) -> None:
    stack = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if not check_text:
                continue
            if not _is_unicode(value):
                raise JsonInputError(path or None, "is not valid Unicode (it holds a lone surrogate)")
            if "\x00" in value:
                raise JsonInputError(path or None, "holds a NUL character (\\u0000)")
            continue
        if isinstance(value, _Unreadable):
            raise JsonInputError(path or None, value.problem)
        if not isinstance(value, (dict, list)):
            continue
        if check_text and depth > MAX_JSON_DEPTH:
            raise _too_deep(path)
        if isinstance(value, dict):
            for key in reversed(list(value)):
                if check_text and (not _is_unicode(key) or "\x00" in key):
                    raise JsonInputError(path or None, "has a key that is not valid Unicode or holds a NUL character")
                stack.append((value[key], f"{path}.{key}" if path else key, depth + 1))
        else:
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in reversed(list(enumerate(value))))


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _too_deep(path: str | None) -> JsonInputError:
    """Names the top-level parameter only: a path 32 levels deep is no help to anyone."""
    param = (path or "").split(".")[0].split("[")[0]
    return JsonInputError(param or None, f"is nested too deeply (at most {MAX_JSON_DEPTH} levels)",
                          message=f"The JSON body is nested too deeply (at most {MAX_JSON_DEPTH} levels).")
