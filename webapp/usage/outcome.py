"""What the chunks of one generation added up to: each choice's text, the engine's token counts and how it ended.

Filled chunk by chunk by the OpenAI-compatible API and by the chat page alike; when the generation
ends, ``usage.services.usage_record_finish`` turns it into a usage record. A request with n > 1
samples has n choices (Chunk.samples): its usage counts the prompt once and the completions summed.
``text``, ``logprobs`` and ``finish_reason`` are the first choice's (the only one when n == 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.protocol import Chunk, ErrorInfo


@dataclass
class ChoiceOutcome:
    text: str = ""
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    stop_reason: str | int | None = None  # the stop string (or token id) that ended it


@dataclass
class Outcome:
    choices: list[ChoiceOutcome] = field(default_factory=lambda: [ChoiceOutcome()])
    num_prompt_tokens: int | None = None
    num_cached_tokens: int = 0
    time_to_first_token: float | None = None
    error: ErrorInfo | None = None
    finished: bool = False
    served_version: str | None = None  # the answering worker's version label

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def logprobs(self) -> list[dict]:
        return self.choices[0].logprobs

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason

    @property
    def num_output_tokens(self) -> int:
        return sum(c.num_output_tokens for c in self.choices)

    def choice(self, index: int) -> ChoiceOutcome:
        while len(self.choices) <= index:
            self.choices.append(ChoiceOutcome())
        return self.choices[index]

    def add(self, chunk: Chunk) -> None:
        self.served_version = chunk.version or self.served_version
        self.finished = chunk.finished
        self.error = chunk.error
        if chunk.error is None:
            self.num_prompt_tokens = chunk.num_prompt_tokens
            self.num_cached_tokens = chunk.num_cached_tokens
            self.time_to_first_token = chunk.time_to_first_token
        if chunk.samples is not None:
            for delta in chunk.samples:
                choice = self.choice(delta["index"])
                choice.text += delta["text"]
                choice.logprobs.extend(delta.get("logprobs") or [])
                choice.finish_reason = delta.get("finish_reason") or choice.finish_reason
                choice.stop_reason = delta.get("stop_reason", choice.stop_reason)
                choice.num_output_tokens = delta.get("num_output_tokens", choice.num_output_tokens)
            return
        choice = self.choices[0]
        choice.text += chunk.text
        choice.logprobs.extend(chunk.logprobs or [])
        if chunk.error is None:
            choice.num_output_tokens = chunk.num_output_tokens
        if chunk.finished:
            choice.finish_reason = chunk.finish_reason
            choice.stop_reason = chunk.stop_reason
