"""Response bodies and stream chunks in OpenAI's shapes."""

from __future__ import annotations

import json

from webapp.openai_api.services import CHAT, Generation, Outcome
from webapp.registry.tokenizers import ModelTokenizer

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def usage_body(outcome: Outcome) -> dict:
    prompt = outcome.num_prompt_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": outcome.num_output_tokens,
            "total_tokens": prompt + outcome.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": outcome.num_cached_tokens}}


def finish_reason(reason: str | None) -> str | None:
    return "stop" if reason == "abort" else reason  # OpenAI knows stop and length


def _token(tokenizer: ModelTokenizer, token_id: int, logprob: float) -> dict:
    text = tokenizer.decode_token(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(tokenizer: ModelTokenizer, entries: list[dict]) -> dict:
    return {"content": [
        {**_token(tokenizer, e["token_id"], e["logprob"]),
         "top_logprobs": [_token(tokenizer, tid, lp) for tid, lp in e.get("top") or []]}
        for e in entries]}


def completion_logprobs(tokenizer: ModelTokenizer, entries: list[dict], text_offset: int = 0) -> dict:
    tokens, offsets = [], []
    for entry in entries:
        tokens.append(tokenizer.decode_token(entry["token_id"]))
        offsets.append(text_offset)
        text_offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{tokenizer.decode_token(tid): lp for tid, lp in e.get("top") or []} for e in entries],
            "text_offset": offsets}


def _envelope(gen: Generation, obj: str) -> dict:
    return {"id": gen.request_id, "object": obj, "created": gen.created, "model": gen.model.slug}


def completion_body(gen: Generation, outcome: Outcome) -> dict:
    """The non-streaming response."""
    if gen.endpoint == CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": outcome.text},
                  "logprobs": chat_logprobs(gen.tokenizer, outcome.logprobs) if gen.wants_logprobs else None,
                  "finish_reason": finish_reason(outcome.finish_reason)}
        return {**_envelope(gen, "chat.completion"), "choices": [choice], "usage": usage_body(outcome)}
    choice = {"index": 0, "text": outcome.text,
              "logprobs": completion_logprobs(gen.tokenizer, outcome.logprobs) if gen.wants_logprobs else None,
              "finish_reason": finish_reason(outcome.finish_reason)}
    return {**_envelope(gen, "text_completion"), "choices": [choice], "usage": usage_body(outcome)}


class StreamFormatter:
    """The SSE chunks of one streamed response, in order."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.text_offset = 0

    def _chunk(self, choice: dict) -> bytes:
        obj = "chat.completion.chunk" if self.gen.endpoint == CHAT else "text_completion"
        body = {**_envelope(self.gen, obj), "choices": [choice]}
        if self.gen.include_usage:
            body["usage"] = None
        return sse(body)

    def start(self) -> bytes:
        """Chat streams open with the assistant's role; completion streams have no opener."""
        if self.gen.endpoint != CHAT:
            return b""
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def delta(self, text: str, logprobs: list[dict] | None, reason: str | None = None) -> bytes:
        if not text and not logprobs and reason is None:
            return b""  # a chunk that only moved the stop-string holdback
        tokenizer = self.gen.tokenizer
        if self.gen.endpoint == CHAT:
            choice = {"index": 0, "delta": {"content": text} if text or not reason else {},
                      "logprobs": chat_logprobs(tokenizer, logprobs or []) if self.gen.wants_logprobs else None,
                      "finish_reason": finish_reason(reason)}
        else:
            choice = {"index": 0, "text": text,
                      "logprobs": (completion_logprobs(tokenizer, logprobs or [], self.text_offset)
                                   if self.gen.wants_logprobs else None),
                      "finish_reason": finish_reason(reason)}
            self.text_offset += len(text)
        return self._chunk(choice)

    def usage(self, outcome: Outcome) -> bytes:
        if not self.gen.include_usage:
            return b""
        obj = "chat.completion.chunk" if self.gen.endpoint == CHAT else "text_completion"
        return sse({**_envelope(self.gen, obj), "choices": [], "usage": usage_body(outcome)})
