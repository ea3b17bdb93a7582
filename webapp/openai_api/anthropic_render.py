"""Anthropic's Messages API shapes of the internal event stream: the message object, its streamed
events and its errors.

A stream: ``message_start``, ``ping``, then per content block ``content_block_start``,
``content_block_delta`` (``text_delta`` / ``input_json_delta``, the tool input's JSON as it is
generated), ``content_block_stop``; then ``message_delta`` (stop_reason, usage) and
``message_stop``. Errors: ``{"type": "error", "error": {"type", "message"}}``, as the body of a
refusal and as an ``error`` event mid-stream.

``usage.input_tokens`` counts the prompt tokens not read from the prefix cache, and
``cache_read_input_tokens`` those that were (Anthropic's split: their sum is the prompt).
"""

from __future__ import annotations

import json

from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.events import Event, Finish, TextDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallEnd
from webapp.openai_api.events import outcome_folded
from webapp.openai_api.services import Generation
from webapp.usage.outcome import Outcome

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
               504: "timeout_error", 529: "overloaded_error"}


def error_body(error: OpenAIError) -> dict:
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def stop_reason(finish: Finish | None) -> tuple[str, str | None]:
    if finish is None or finish.reason == "stop":
        if finish is not None and finish.stop_sequence:
            return "stop_sequence", finish.stop_sequence
        return "end_turn", None
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(finish.reason, "end_turn"), None


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def usage(outcome: Outcome, num_prompt_tokens: int) -> dict:
    prompt = outcome.num_prompt_tokens if outcome.num_prompt_tokens is not None else num_prompt_tokens
    return {"input_tokens": prompt - outcome.num_cached_tokens, "output_tokens": outcome.num_output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": outcome.num_cached_tokens}


def _message(gen: Generation, content: list[dict], reason: str | None, sequence: str | None, usage_: dict) -> dict:
    return {"id": gen.request_id, "type": "message", "role": "assistant", "model": gen.model.slug,
            "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": usage_}


def message_body(gen: Generation, outcome: Outcome) -> dict:
    """The non-streamed answer."""
    choice = outcome.choices[0]
    folded = outcome_folded(gen.tools, choice.text, choice.finish_reason, choice.stop_reason)
    content = [{"type": "text", "text": value} if kind == "text" else
               {"type": "tool_use", "id": tool_use_id(value["id"]), "name": value["name"],
                "input": _input(value["arguments"])}
               for kind, value in folded.items]
    reason, sequence = stop_reason(folded.finish)
    return _message(gen, content, reason, sequence, usage(outcome, len(gen.prompt_token_ids)))


def event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class MessageStream:
    """The events of one streamed message."""

    final = None

    def __init__(self, gen: Generation):
        self.gen = gen
        self.num_blocks = 0
        self.open: str | None = None  # "text" or "tool_use": the block being streamed
        self.finish: Finish | None = None

    def start(self) -> bytes:
        start_usage = {"input_tokens": len(self.gen.prompt_token_ids), "output_tokens": 0,
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        return (event("message_start", {"type": "message_start",
                                        "message": _message(self.gen, [], None, None, start_usage)})
                + event("ping", {"type": "ping"}))

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        self.num_blocks += 1
        return event("content_block_stop", {"type": "content_block_stop", "index": self.num_blocks - 1})

    def _open(self, kind: str, block: dict) -> bytes:
        out = self._close()
        self.open = kind
        return out + event("content_block_start", {"type": "content_block_start", "index": self.num_blocks,
                                                   "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.num_blocks,
                                             "delta": delta})

    def events(self, index: int, events: list[Event]) -> bytes:
        out = []
        for e in events:
            if isinstance(e, TextDelta) and e.text:
                if self.open != "text":
                    out.append(self._open("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": e.text}))
            elif isinstance(e, ToolCallBegin):
                out.append(self._open("tool_use", {"type": "tool_use", "id": tool_use_id(e.id), "name": e.name,
                                                   "input": {}}))
            elif isinstance(e, ToolArgumentsDelta):
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.text}))
            elif isinstance(e, ToolCallEnd):
                out.append(self._close())
            elif isinstance(e, Finish):
                out.append(self._close())
                self.finish = e
        return b"".join(out)

    def end(self, outcome: Outcome, error: OpenAIError | None) -> bytes:
        if error is not None:
            return self._close() + self.fail(error)
        reason, sequence = stop_reason(self.finish)
        return (self._close()
                + event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                          "usage": usage(outcome, len(self.gen.prompt_token_ids))})
                + event("message_stop", {"type": "message_stop"}))

    def fail(self, error: OpenAIError) -> bytes:
        return event("error", error_body(error))
