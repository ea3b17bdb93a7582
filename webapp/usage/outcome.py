"""What the chunks of one generation added up to: the text, the engine's token counts and how it ended.

Filled chunk by chunk by the OpenAI-compatible API and by the chat page alike; when the generation
ends, ``usage.services.usage_record_finish`` turns it into a usage record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.protocol import Chunk, ErrorInfo


@dataclass
class Outcome:
    text: str = ""
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    time_to_first_token: float | None = None
    error: ErrorInfo | None = None
    finished: bool = False
    served_version: str | None = None  # the answering worker's version label

    def add(self, chunk: Chunk) -> None:
        self.served_version = chunk.version or self.served_version
        self.text += chunk.text
        self.logprobs.extend(chunk.logprobs or [])
        self.finished = chunk.finished
        self.error = chunk.error
        if chunk.error is None:
            self.num_prompt_tokens = chunk.num_prompt_tokens
            self.num_output_tokens = chunk.num_output_tokens
            self.num_cached_tokens = chunk.num_cached_tokens
            self.time_to_first_token = chunk.time_to_first_token
        if chunk.finished:
            self.finish_reason = chunk.finish_reason
