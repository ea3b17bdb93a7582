"""Per-request sampling parameters, validated on construction against published limits.

Every field a caller sets has a range in ``SAMPLING_LIMITS``; ``SamplingParams`` refuses a
value outside it with an ``InvalidParameterError`` naming the field, before the engine stores
anything. The serving layer validates against the same table (it may be narrower, e.g.
OpenAI's temperature 0..2, never wider).

==================== ===================== ==============================================
field                range                 why that bound
==================== ===================== ==============================================
max_tokens           1 .. 2**31-1 or None  also <= the context left after the prompt
temperature          0 .. 100              0 (below 1e-5) is greedy
top_k                -1 .. 2**31-1         -1 and 0 disable; above the vocabulary = off;
                                           the bound keeps the batch's int64 tensor safe
top_p                (0, 1]                1 disables
min_p                0 .. 1                0 disables
repetition_penalty   (0, 10]               1 disables
presence_penalty     -2 .. 2               OpenAI's range
frequency_penalty    -2 .. 2               OpenAI's range
seed                 -2**63 .. 2**64-1     what ``torch.Generator.manual_seed`` accepts
min_tokens           0 .. 2**31-1          and <= max_tokens
logprobs             0 .. 20 or None       top alternatives per token; 0 = chosen only
stop                 <= 16 strings,        each string's length in characters
                     each <= 1024 chars
stop_token_ids       <= 256 ids,           each also below the model's vocabulary size
                     each 0 .. 2**31-1     (checked by the engine, which knows it)
logit_bias           <= 1024 entries,      OpenAI's range; token ids also below the
                     each -100 .. 100      vocabulary size (checked by the engine)
structured_outputs   one constraint or     engine/structured/spec.py: json, json_object,
                     None                  regex, choice, grammar; refused when llguidance
                                           cannot enforce it
==================== ===================== ==============================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import InvalidParameterError

_GREEDY_EPSILON = 1e-5
MAX_INT32 = 2**31 - 1
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class Limit:
    """Allowed values of one field: ``low <= x <= high`` (``low < x`` when ``low_exclusive``).

    For a list field, ``max_items`` bounds its length and low/high bound each item (for
    strings, each item's length in characters).
    """

    kind: type  # int or float (a float field also takes ints; never bools)
    low: int | float
    high: int | float
    low_exclusive: bool = False
    max_items: int | None = None

    def allows(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float else int):
            return False
        if self.kind is float and not math.isfinite(value):
            return False
        above_low = value > self.low if self.low_exclusive else value >= self.low
        return above_low and value <= self.high

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        low = f"greater than {self.low}" if self.low_exclusive else f"at least {self.low}"
        return f"{what} {low} and at most {self.high}"


SAMPLING_LIMITS: dict[str, Limit] = {
    "max_tokens": Limit(int, 1, MAX_INT32),
    "temperature": Limit(float, 0.0, 100.0),
    "top_k": Limit(int, -1, MAX_INT32),
    "top_p": Limit(float, 0.0, 1.0, low_exclusive=True),
    "min_p": Limit(float, 0.0, 1.0),
    "repetition_penalty": Limit(float, 0.0, 10.0, low_exclusive=True),
    "presence_penalty": Limit(float, -2.0, 2.0),
    "frequency_penalty": Limit(float, -2.0, 2.0),
    "seed": Limit(int, -2**63, 2**64 - 1),
    "min_tokens": Limit(int, 0, MAX_INT32),
    "logprobs": Limit(int, 0, MAX_LOGPROBS),
    "stop": Limit(int, 0, 1024, max_items=16),
    "stop_token_ids": Limit(int, 0, MAX_INT32, max_items=256),
    "logit_bias": Limit(float, -100.0, 100.0, max_items=1024),  # {token id: bias}
}
_OPTIONAL = {"max_tokens", "seed", "logprobs"}  # None allowed
_FLAGS = ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output")


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
    # the output's constraint (engine/structured/spec.py); JSON-serialisable, as it crosses workers
    structured_outputs: dict | None = None
    # token id -> added to its logit before sampling (OpenAI's logit_bias); JSON's string keys taken
    logit_bias: dict[int, float] | None = None
    stop_strings: tuple[str, ...] = field(init=False, repr=False)
    grammar: str | None = field(init=False, repr=False, default=None)  # llguidance's, checked

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)) and self.stop is not None:
            raise InvalidParameterError("stop", "must be a string or a list of strings")
        if not isinstance(self.stop_token_ids, (list, tuple)) and self.stop_token_ids is not None:
            raise InvalidParameterError("stop_token_ids", "must be a list of token ids")
        if isinstance(self.logit_bias, dict):
            self.logit_bias = {_token_key(k): v for k, v in self.logit_bias.items()}
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self.validate()
        self.stop_strings = tuple(s for s in self.stop if s)

    def validate(self) -> None:
        """Raise ``InvalidParameterError`` naming the first field outside ``SAMPLING_LIMITS``.

        Run on construction and again by the engine at admission (a caller may have changed a
        field since); never per step.
        """
        for name, limit in SAMPLING_LIMITS.items():
            value = getattr(self, name)
            if name == "logit_bias":
                _check_bias(value, limit)
            elif limit.max_items is not None:
                _check_list(name, value, limit)
            elif not (value is None and name in _OPTIONAL) and not limit.allows(value):
                raise InvalidParameterError(name, f"must be {limit.describe()}, got {_show(value)}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParameterError(
                "min_tokens", f"must not exceed max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidParameterError(name, f"must be true or false, got {_show(getattr(self, name))}")
        if self.structured_outputs is not None:
            from engine.structured.spec import structured_grammar  # llguidance: no torch

            self.grammar = structured_grammar(self.structured_outputs)
            if self.ignore_eos:
                raise InvalidParameterError("ignore_eos", "cannot be combined with structured_outputs: "
                                                          "the grammar decides where the output ends")
        else:
            self.grammar = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPSILON

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def _check_list(name: str, items: object, limit: Limit) -> None:
    if not isinstance(items, list):
        raise InvalidParameterError(name, "must be a list")
    if len(items) > limit.max_items:
        raise InvalidParameterError(name, f"at most {limit.max_items} items, got {len(items)}")
    for item in items:
        if name == "stop":
            if not isinstance(item, str):
                raise InvalidParameterError(name, "must be a string or a list of strings")
            if not limit.allows(len(item)):
                raise InvalidParameterError(name, f"each string must be at most {limit.high} "
                                                  f"characters, got {len(item)}")
        elif not limit.allows(item):
            raise InvalidParameterError(name, f"each item must be {limit.describe()}, got {_show(item)}")


def _token_key(key: object) -> object:
    """A logit_bias key as an int: JSON object keys arrive as strings ("50256")."""
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10:
        return int(key)
    return key


def _check_bias(bias: object, limit: Limit) -> None:
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise InvalidParameterError("logit_bias", "must be an object mapping token ids to biases")
    if len(bias) > limit.max_items:
        raise InvalidParameterError("logit_bias", f"at most {limit.max_items} entries, got {len(bias)}")
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_INT32:
            raise InvalidParameterError("logit_bias", f"keys must be token ids (0 to {MAX_INT32}), got {_show(token)}")
        if not limit.allows(value):
            raise InvalidParameterError("logit_bias", f"biases must be {limit.describe()}, got {_show(value)}")


def _show(value: object) -> str:
    """A short repr for messages: a 10**6-digit integer must not become a 1 MB error."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 256 else "a huge integer"
    return text if len(text) <= 64 else text[:61] + "..."
