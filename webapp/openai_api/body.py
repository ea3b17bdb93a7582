"""Reading an API request's body as JSON, refusing what would hurt the server later.

A hostile body fails here, before admission, as a 400 OpenAI error: JSON that is not valid, nested
deeper than MAX_JSON_DEPTH (the JSON parser's own recursion would end in a RecursionError at about
a thousand levels), or holding a string that is not valid Unicode (a lone surrogate such as
``"\\ud800"`` parses, but no database, tokenizer or log can store it) or that holds a NUL
character (``"\\u0000"``: PostgreSQL's text cannot hold it). The walk is iterative, so no body
can make it recurse.
"""

from __future__ import annotations

import json

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from webapp.openai_api import errors

MAX_JSON_DEPTH = 32  # an OpenAI request needs about 5 (messages[].content[].text)


def body_parse(request: HttpRequest):
    """The body as a JSON value (not necessarily an object: the InputSerializer says so); OpenAIError if not."""
    try:
        data = json.loads(request.body)
    except RequestDataTooBig:
        raise errors.OpenAIError(413, "The request body is too large.", code="request_too_large") from None
    except RecursionError:
        raise _too_deep(None) from None
    except ValueError:  # also UnicodeDecodeError: bytes that are not UTF-8
        raise errors.invalid_parameter(None, "We could not parse the JSON body of your request.") from None
    _check(data)
    return data


def _check(data) -> None:
    stack = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                raise errors.invalid_parameter(path or None, _where(path, "is not valid Unicode (it holds a lone "
                                                                          "surrogate)"))
            if "\x00" in value:
                raise errors.invalid_parameter(path or None, _where(path, "holds a NUL character (\\u0000)"))
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(path)
        if isinstance(value, dict):
            for key in reversed(list(value)):
                if not _is_unicode(key) or "\x00" in key:
                    raise errors.invalid_parameter(path or None, _where(path, "has a key that is not valid "
                                                                              "Unicode or holds a NUL character"))
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


def _where(path: str, problem: str) -> str:
    return f"Invalid value for {path!r}: {problem}." if path else f"The request body {problem}."


def _too_deep(path: str | None) -> errors.OpenAIError:
    """Names the top-level parameter only: a path 32 levels deep is no help to anyone."""
    param = (path or "").split(".")[0].split("[")[0]
    return errors.invalid_parameter(param or None, f"The JSON body is nested too deeply (at most {MAX_JSON_DEPTH} "
                                                  "levels).")
