"""Reading and checking an uploaded batch input file, line by line.

Each line is ``{"custom_id", "method": "POST", "url", "body"}``; the body is checked by the very
InputSerializer of the endpoint it names (webapp/openai_api/views.py), so a line that passes here
is one the API would take. The line itself is read as the API reads a body (webapp/openai_api/body.py:
nesting, Unicode, and numbers no field can hold). A refusal names the line (1-based) and the field,
e.g. ``Line 3: body.temperature: must be ...``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework.exceptions import ValidationError

from webapp.openai_api import errors
from webapp.openai_api.body import JsonInputError, json_read
from webapp.openai_api.errors import first_error

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
ENDPOINTS = (CHAT_URL, COMPLETIONS_URL)
MAX_CUSTOM_ID_LENGTH = 512


@dataclass
class InputLine:
    line_number: int
    custom_id: str
    url: str
    body: dict


class LineError(Exception):
    def __init__(self, line_number: int, field: str | None, message: str):
        where = f"Line {line_number}: {field}: " if field else f"Line {line_number}: "
        super().__init__(where + message)
        self.line_number, self.field, self.message = line_number, field, message

    def to_openai(self) -> errors.OpenAIError:
        return errors.OpenAIError(400, str(self), param="file", code="invalid_batch_line")

    def to_batch_error(self) -> dict:
        return {"code": "invalid_batch_line", "message": str(self), "param": self.field, "line": self.line_number}


def input_serializer(url: str):
    from webapp.openai_api.views import ChatCompletionCreateApi, CompletionCreateApi

    return ChatCompletionCreateApi.InputSerializer if url == CHAT_URL else CompletionCreateApi.InputSerializer


def check_body(line_number: int, url: str, body) -> dict:
    """The body's validated values (the endpoint's InputSerializer); LineError naming the field."""
    if isinstance(body, dict) and body.get("stream"):
        raise LineError(line_number, "body.stream", "streaming is not available in a batch")
    serializer = input_serializer(url)(data=body)
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        param, message = first_error(exc.detail)
        raise LineError(line_number, f"body.{param}" if param else "body", message) from None
    return serializer.validated_data


def parse_line(line_number: int, raw: bytes) -> InputLine:
    try:  # read as the API reads a body: a number no field can hold is refused naming its field
        data = json_read(raw)
    except JsonInputError as exc:
        raise LineError(line_number, exc.param, exc.problem) from None
    if not isinstance(data, dict):
        raise LineError(line_number, None, "must be a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(line_number, "custom_id", "must be a non-empty string")
    if len(custom_id) > MAX_CUSTOM_ID_LENGTH:
        raise LineError(line_number, "custom_id", f"must be at most {MAX_CUSTOM_ID_LENGTH} characters")
    if data.get("method") != "POST":
        raise LineError(line_number, "method", "must be \"POST\"")
    url = data.get("url")
    if url not in ENDPOINTS:
        raise LineError(line_number, "url", f"must be one of {', '.join(ENDPOINTS)}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise LineError(line_number, "body", "must be a JSON object")
    extra = sorted(set(data) - {"custom_id", "method", "url", "body"})
    if extra:
        raise LineError(line_number, extra[0], "is not a field of a batch request")
    return InputLine(line_number, custom_id, url, body)


def read_lines(content: bytes, *, max_lines: int) -> list[InputLine]:
    """Every line of an input file, checked; LineError at the first bad one. Blank lines are skipped;
    all lines must name the same endpoint and model, and no custom_id may repeat."""
    lines: list[InputLine] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            raise LineError(number, None, f"the file has more than {max_lines} requests")
        line = parse_line(number, raw)
        if line.custom_id in seen:
            raise LineError(number, "custom_id", f"{line.custom_id!r} is used already by line {seen[line.custom_id]}")
        seen[line.custom_id] = number
        if lines and line.url != lines[0].url:
            raise LineError(number, "url", f"every line must use the same url ({lines[0].url})")
        if lines and line.body.get("model") != lines[0].body.get("model"):
            raise LineError(number, "body.model", f"every line must use the same model ({lines[0].body.get('model')!r})")
        check_body(number, line.url, line.body)
        lines.append(line)
    if not lines:
        raise LineError(1, None, "the file holds no requests")
    return lines
