"""OpenAI's Responses API shapes of the internal event stream: the Response object and its
streamed events (each with its ``sequence_number``), as ``openai.types.responses`` reads them.

A stream: ``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, then for a message ``response.content_part.added``,
``response.output_text.delta`` ..., ``response.output_text.done``, ``response.content_part.done``,
or for a function call ``response.function_call_arguments.delta`` ... (the arguments as they are
generated), ``response.function_call_arguments.done``; ``response.output_item.done``; last
``response.completed`` (``response.incomplete`` when the token limit cut the answer, or
``response.failed``).
"""

from __future__ import annotations

import json
import uuid

from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.events import (Event, Finish, TextDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallEnd,
                                      fold, outcome_folded)
from webapp.openai_api.services import Generation
from webapp.usage.outcome import Outcome


def usage_body(outcome: Outcome) -> dict:
    prompt = outcome.num_prompt_tokens or 0
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": outcome.num_cached_tokens, "cache_write_tokens": 0},
            "output_tokens": outcome.num_output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + outcome.num_output_tokens}


def response_object(*, response_id: str, values: dict, model: str, created_at: float, status: str,
                    output: list[dict] | None = None, usage: dict | None = None, error: dict | None = None,
                    incomplete: str | None = None) -> dict:
    echo = values["response"]
    return {"id": response_id, "object": "response", "created_at": created_at, "status": status,
            "background": echo["background"], "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": echo["instructions"], "max_output_tokens": echo["max_output_tokens"],
            "metadata": echo["metadata"], "model": model, "output": output or [],
            "parallel_tool_calls": echo["parallel_tool_calls"], "previous_response_id": echo["previous_response_id"],
            "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "store": echo["store"],
            "temperature": echo["temperature"], "text": echo["text"], "tool_choice": echo["tool_choice"],
            "tools": echo["tools"], "top_p": echo["top_p"], "truncation": "disabled", "usage": usage,
            "user": echo["user"]}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_text_part(text)] if status == "completed" else []}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call: dict, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["name"],
            "arguments": call["arguments"], "status": status}


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _status(finish: Finish | None) -> tuple[str, str | None]:
    if finish is not None and finish.reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


def _final(gen: Generation, outcome: Outcome, finish: Finish | None, output: list[dict]) -> dict:
    status, incomplete = _status(finish)
    return response_object(response_id=gen.request_id, values=gen.values, model=gen.model.slug,
                           created_at=gen.created, status=status, output=output, usage=usage_body(outcome),
                           incomplete=incomplete)


def output_conversation(output: list[dict]) -> tuple[str, list[dict]]:
    """(the text, the calls {"id", "name", "arguments"}) of a response's output items."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
             for item in output if item["type"] == "function_call"]
    return text, calls


def response_body(gen: Generation, outcome: Outcome) -> dict:
    """The non-streamed answer."""
    choice = outcome.choices[0]
    folded = outcome_folded(gen.tools, choice.text, choice.finish_reason, choice.stop_reason)
    output = [_message_item(new_item_id("msg"), value) if kind == "text" else _call_item(new_item_id("fc"), value)
              for kind, value in folded.items]
    return _final(gen, outcome, folded.finish, output)


class ResponseStream:
    """The events of one streamed response."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.sequence = 0
        self.output: list[dict] = []  # the items done so far
        self.item: dict | None = None  # the item being streamed
        self.events_seen: list[Event] = []
        self.final: dict | None = None

    def _event(self, kind: str, **data) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def _response(self, status: str, **kwargs) -> dict:
        return response_object(response_id=self.gen.request_id, values=self.gen.values, model=self.gen.model.slug,
                               created_at=self.gen.created, status=status, **kwargs)

    def start(self) -> bytes:
        return (self._event("response.created", response=self._response("in_progress"))
                + self._event("response.in_progress", response=self._response("in_progress")))

    def _item_ids(self) -> dict:
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def _open(self, item: dict) -> bytes:
        out = self._close()
        self.item = item
        out += self._event("response.output_item.added", output_index=len(self.output), item=item)
        if item["type"] == "message":
            out += self._event("response.content_part.added", **self._item_ids(), content_index=0,
                               part=_text_part(""))
        return out

    def _close(self) -> bytes:
        item = self.item
        if item is None:
            return b""
        if item["type"] == "message":
            text = item.pop("_text", "")
            out = (self._event("response.output_text.done", **self._item_ids(), content_index=0, text=text,
                               logprobs=[])
                   + self._event("response.content_part.done", **self._item_ids(), content_index=0,
                                 part=_text_part(text)))
            done = _message_item(item["id"], text)
        else:
            out = self._event("response.function_call_arguments.done", **self._item_ids(),
                              arguments=item["arguments"], name=item["name"])
            done = {**item, "status": "completed"}
        out += self._event("response.output_item.done", output_index=len(self.output), item=done)
        self.output.append(done)
        self.item = None
        return out

    def events(self, index: int, events: list[Event]) -> bytes:
        out = []
        self.events_seen += events
        for e in events:
            if isinstance(e, TextDelta) and e.text:
                if self.item is None or self.item["type"] != "message":
                    out.append(self._open(_message_item(new_item_id("msg"), "", "in_progress")))
                self.item["_text"] = self.item.get("_text", "") + e.text
                out.append(self._event("response.output_text.delta", **self._item_ids(), content_index=0,
                                       delta=e.text, logprobs=[]))
            elif isinstance(e, ToolCallBegin):
                out.append(self._open(_call_item(new_item_id("fc"), {"id": e.id, "name": e.name, "arguments": ""},
                                                 "in_progress")))
            elif isinstance(e, ToolArgumentsDelta):
                self.item["arguments"] += e.text
                out.append(self._event("response.function_call_arguments.delta", **self._item_ids(), delta=e.text))
            elif isinstance(e, (ToolCallEnd, Finish)):
                out.append(self._close())
        return b"".join(out)

    def end(self, outcome: Outcome, error: OpenAIError | None) -> bytes:
        out = self._close()
        if error is not None:
            return out + self.fail(error)
        self.final = _final(self.gen, outcome, fold(self.events_seen).finish, self.output)
        kind = "response.completed" if self.final["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, response=self.final)

    def fail(self, error: OpenAIError) -> bytes:
        failed = self._response("failed", output=self.output,
                                error={"code": error.code or "server_error", "message": error.message})
        return self._event("response.failed", response=failed)

