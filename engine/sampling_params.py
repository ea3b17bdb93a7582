"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import InvalidParameterError

_GREEDY_EPSILON = 1e-5
MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    ``temperature == 0`` means greedy decoding; every other sampling knob is then
    ignored except the penalties, which change the logits before the argmax.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # number of top alternatives; 0 = chosen token only
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_strings: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._validate()
        self.stop_strings = tuple(s for s in self.stop if s)

    def _validate(self) -> None:
        def check(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise InvalidParameterError(param, message)

        check(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
              "max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        check(_is_number(self.temperature) and 0.0 <= self.temperature <= 100.0,
              "temperature", f"must be between 0 and 100, got {self.temperature!r}")
        check(isinstance(self.top_k, int) and self.top_k >= 0,
              "top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        check(_is_number(self.top_p) and 0.0 < self.top_p <= 1.0,
              "top_p", f"must be in (0, 1], got {self.top_p!r}")
        check(_is_number(self.min_p) and 0.0 <= self.min_p <= 1.0,
              "min_p", f"must be in [0, 1], got {self.min_p!r}")
        check(_is_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0,
              "repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty!r}")
        check(_is_number(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
              "presence_penalty", f"must be between -2 and 2, got {self.presence_penalty!r}")
        check(_is_number(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
              "frequency_penalty", f"must be between -2 and 2, got {self.frequency_penalty!r}")
        check(self.seed is None or isinstance(self.seed, int),
              "seed", f"must be an integer, got {self.seed!r}")
        check(all(isinstance(s, str) for s in self.stop),
              "stop", "must be a string or a list of strings")
        check(len(self.stop) <= 16, "stop", f"at most 16 stop strings, got {len(self.stop)}")
        check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
              "stop_token_ids", "must be a list of non-negative token ids")
        check(isinstance(self.min_tokens, int) and self.min_tokens >= 0,
              "min_tokens", f"must be a non-negative integer, got {self.min_tokens!r}")
        check(self.max_tokens is None or self.min_tokens <= self.max_tokens,
              "min_tokens", f"must not exceed max_tokens ({self.max_tokens}), got {self.min_tokens}")
        check(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
              "logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.logprobs!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPSILON

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
