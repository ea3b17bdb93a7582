"""Response bodies and stream chunks in OpenAI's shapes.

Chat logprobs are OpenAI's ``choices[i].logprobs = {"content": [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}], "refusal": None}``, where ``bytes`` are the token's own
UTF-8 bytes (a token holding half of a character has the raw half); /v1/completions keeps the
legacy ``{tokens, token_logprobs, top_logprobs, text_offset}``. With n > 1 (or a completion's list
of prompts) every choice has its ``index``, prompt index x n + sample index; a stream sends one
chunk per choice delta, each naming its ``index``, the prompts' chunks interleaved as they come.
"""

from __future__ import annotations

import functools
import json

from webapp.openai_api.completion_extras import best_choices
from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.events import Event, Finish
from webapp.openai_api.serializers import prompt_list
from webapp.openai_api.services import CHAT, Generation, Outcome
from webapp.openai_api.tool_calls import apply_tool_calls, openai_delta
from webapp.registry.tokenizers import ModelTokenizer
from webapp.usage.outcome import ChoiceOutcome
from workers.protocol import Chunk

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def usage_body(outcome: Outcome) -> dict:
    """Prompt counted once, the completions of every choice summed."""
    prompt = outcome.num_prompt_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": outcome.num_output_tokens,
            "total_tokens": prompt + outcome.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": outcome.num_cached_tokens}}


def finish_reason(reason: str | None) -> str | None:
    return "stop" if reason == "abort" else reason  # OpenAI knows stop and length


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character of each byte, reversed (byte-level BPE pieces)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer: ModelTokenizer, token_id: int, text: str) -> list[int]:
    """The token's own bytes: byte-level BPE pieces and <0xNN> byte-fallback pieces exactly."""
    piece = tokenizer.tokenizer.id_to_token(token_id)
    if piece is None:
        return list(text.encode())
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return [int(piece[3:5], 16)]
    if type(tokenizer.tokenizer.decoder).__name__ == "ByteLevel" and piece != text:
        table = _byte_level_decoder()
        if all(c in table for c in piece):
            return [table[c] for c in piece]
    return list(text.encode())


def _token(tokenizer: ModelTokenizer, token_id: int, logprob: float) -> dict:
    text = tokenizer.decode_token(token_id)
    return {"token": text, "logprob": logprob, "bytes": token_bytes(tokenizer, token_id, text)}


def chat_logprobs(tokenizer: ModelTokenizer, entries: list[dict]) -> dict:
    return {"content": [
        {**_token(tokenizer, e["token_id"], e["logprob"]),
         "top_logprobs": [_token(tokenizer, tid, lp) for tid, lp in e.get("top") or []]}
        for e in entries], "refusal": None}


def completion_logprobs(tokenizer: ModelTokenizer, entries: list[dict], text_offset: int = 0) -> dict:
    tokens, offsets = [], []
    for entry in entries:
        tokens.append(tokenizer.decode_token(entry["token_id"]))
        offsets.append(text_offset)
        text_offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{tokenizer.decode_token(tid): lp for tid, lp in e.get("top") or []} for e in entries],
            "text_offset": offsets}


def echoed_prompt(gen: Generation, prompt_index: int = 0) -> str:
    """A completion's prompt text (the ``prompt_index``-th of its list) when ``echo`` asks for it, else ""."""
    if gen.endpoint == CHAT or not gen.values.get("echo"):
        return ""
    prompt = prompt_list(gen.values["prompt"])[prompt_index]
    return prompt if isinstance(prompt, str) else gen.tokenizer.tokenizer.decode(prompt, skip_special_tokens=False)


def _envelope(gen: Generation, obj: str) -> dict:
    return {"id": gen.request_id, "object": obj, "created": gen.created, "model": gen.model.slug}


def _answered(gen: Generation, outcome: Outcome) -> list[tuple[int, ChoiceOutcome]]:
    """(prompt index, sample) of each choice answered, in order: every sample of every prompt, or
    with best_of the best n of each prompt's best_of samples."""
    outcome.choice(gen.num_choices - 1)  # every choice listed, also one that produced nothing
    n = gen.n if gen.endpoint == CHAT else (gen.values.get("n") or 1)
    answered = []
    for prompt_index in range(gen.num_prompts):
        samples = outcome.choices[prompt_index * gen.n:(prompt_index + 1) * gen.n]
        if n < gen.n:  # best_of
            samples = best_choices(samples, n)
        answered += [(prompt_index, sample) for sample in samples]
    return answered


def completion_body(gen: Generation, outcome: Outcome) -> dict:
    """The non-streaming response: one choice per sample, by index (prompt index x n + sample index)."""
    choices = []
    for index, (prompt_index, sample) in enumerate(_answered(gen, outcome)):
        if gen.endpoint == CHAT:
            choices.append({"index": index, "message": {"role": "assistant", "content": sample.text},
                            "logprobs": chat_logprobs(gen.tokenizer, sample.logprobs) if gen.wants_logprobs else None,
                            "finish_reason": finish_reason(sample.finish_reason)})
            if gen.tools is not None:  # calls in the text become message.tool_calls
                apply_tool_calls(gen.tools, choices[-1])
        else:
            choices.append({"index": index, "text": echoed_prompt(gen, prompt_index) + sample.text,
                            "logprobs": (completion_logprobs(gen.tokenizer, sample.logprobs)
                                         if gen.wants_logprobs else None),
                            "finish_reason": finish_reason(sample.finish_reason)})
    obj = "chat.completion" if gen.endpoint == CHAT else "text_completion"
    return {**_envelope(gen, obj), "choices": choices, "usage": usage_body(outcome)}


class StreamFormatter:
    """The SSE chunks of one streamed chat or legacy completion, in order, from the internal events
    (webapp/openai_api/events.py): a text delta and its choice's finish travel in one chunk, as before."""

    final = None  # chat completions keep nothing

    def __init__(self, gen: Generation):
        self.gen = gen
        self.text_offsets = [0] * gen.num_choices  # completions: characters streamed so far, per choice

    def _chunk(self, choice: dict) -> bytes:
        obj = "chat.completion.chunk" if self.gen.endpoint == CHAT else "text_completion"
        body = {**_envelope(self.gen, obj), "choices": [choice]}
        if self.gen.include_usage:
            body["usage"] = None
        return sse(body)

    def start(self) -> bytes:
        """Chat streams open with the assistant's role (once per choice); completion streams have no
        opener but the prompt when it is echoed."""
        if self.gen.endpoint != CHAT:  # (best_of is not streamed: choice i is prompt i // n's)
            return b"".join(self._chunk({"index": i, "text": echo, "logprobs": None, "finish_reason": None})
                            for i in range(self.gen.num_choices) if (echo := echoed_prompt(self.gen, i // self.gen.n)))
        return b"".join(self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}) for i in range(self.gen.n))

    def events(self, index: int, events: list[Event]) -> bytes:
        out, i = [], 0
        while i < len(events):
            event = events[i]
            if self.gen.tools is not None and not isinstance(event, Finish):
                if (delta := openai_delta(event)) is not None:
                    out.append(self._chunk({"index": index, "delta": delta, "logprobs": None, "finish_reason": None}))
            elif isinstance(event, Finish):
                out.append(self.delta("", None, event.reason, index=index))
            elif i + 1 < len(events) and isinstance(events[i + 1], Finish):
                out.append(self.delta(event.text, event.logprobs, events[i + 1].reason, index=index))
                i += 1
            else:
                out.append(self.delta(event.text, event.logprobs, index=index))
            i += 1
        return b"".join(out)

    def delta(self, text: str, logprobs: list[dict] | None, reason: str | None = None, *, index: int = 0) -> bytes:
        tokenizer = self.gen.tokenizer
        if self.gen.tools is not None:
            return self._chunk({"index": index, "delta": {}, "logprobs": None, "finish_reason": reason})
        if self.gen.endpoint == CHAT:
            choice = {"index": index, "delta": {"content": text} if text or not reason else {},
                      "logprobs": chat_logprobs(tokenizer, logprobs or []) if self.gen.wants_logprobs else None,
                      "finish_reason": finish_reason(reason)}
        else:
            choice = {"index": index, "text": text,
                      "logprobs": (completion_logprobs(tokenizer, logprobs or [], self.text_offsets[index])
                                   if self.gen.wants_logprobs else None),
                      "finish_reason": finish_reason(reason)}
            self.text_offsets[index] += len(text)
        return self._chunk(choice)

    def end(self, outcome: Outcome, error: OpenAIError | None) -> bytes:
        if error is not None:
            return sse(error.to_dict()) + DONE  # the openai client raises APIError on an "error" event
        if not self.gen.include_usage:
            return DONE
        obj = "chat.completion.chunk" if self.gen.endpoint == CHAT else "text_completion"
        return sse({**_envelope(self.gen, obj), "choices": [], "usage": usage_body(outcome)}) + DONE

    def fail(self, error: OpenAIError) -> bytes:
        return sse(error.to_dict())
