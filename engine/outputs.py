"""What the engine hands back: per-step deltas and finished completions."""

from __future__ import annotations

from dataclasses import dataclass, field


class FinishReason:
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"  # aborted by the caller
    ERROR = "error"  # the engine failed while running this request (see RequestOutput.error)


# RequestOutput.error of a request the engine failed alone: safe to show a client (the
# exception itself is logged by the engine, never put in an output).
REQUEST_FAILED = "the engine failed while running this request"


@dataclass
class TokenLogprob:
    """Log-probability of one generated token and of its top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # [(token_id, logprob)], best first


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """What one request produced in one engine step (a delta, not the running total).

    ``text_delta`` never contains text that may still turn out to be part of a
    stop string, so the concatenation of every delta is exactly the final text.
    With n > 1 samples, ``index`` says whose delta it is (the token counts are that sample's);
    a sample has ended when its ``finish_reason`` is set, and ``finished`` marks the request's
    last output. With n == 1 both happen together and ``index`` is 0.
    """

    request_id: str
    text_delta: str
    token_ids_delta: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    logprobs_delta: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    metrics: RequestMetrics | None = None
    error: str | None = None  # set (REQUEST_FAILED) only with finish_reason FinishReason.ERROR
    index: int = 0  # which of the request's samples (n > 1)
    # An embedding request (engine/embedding_engine.py), finished: [num_inputs, dimensions] float32.
    embeddings: "torch.Tensor | None" = None  # noqa: F821 (this module imports no torch)


@dataclass
class CompletionOutput:
    """A finished request as returned by ``LLM.generate``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None
    metrics: RequestMetrics | None = None
    index: int = 0  # which of the request's n samples
