"""The chat page's sampling settings, held to the API's own limits.

Every sampling parameter of /v1/chat/completions: temperature (OpenAI's 0..2), top_p, top_k,
min_p, presence / frequency / repetition penalties, seed, stop and max_tokens, each within the
engine's published range (``SAMPLING_LIMITS`` through workers/schema.py, never copied). The page
sends numbers, or the text of its number inputs; an empty value leaves the engine's default. A
bad value is refused naming the field, in the API's words ("must be a number at least 0 and at
most 2").
"""

from __future__ import annotations

import dataclasses

from workers.schema import SAMPLING_LIMITS, Limit

OPENAI_MAX_TEMPERATURE = 2.0
NUMBERS: dict[str, Limit] = {
    "max_tokens": SAMPLING_LIMITS["max_tokens"],
    "temperature": dataclasses.replace(SAMPLING_LIMITS["temperature"], high=OPENAI_MAX_TEMPERATURE),
    "top_p": SAMPLING_LIMITS["top_p"],
    "top_k": SAMPLING_LIMITS["top_k"],
    "min_p": SAMPLING_LIMITS["min_p"],
    "presence_penalty": SAMPLING_LIMITS["presence_penalty"],
    "frequency_penalty": SAMPLING_LIMITS["frequency_penalty"],
    "repetition_penalty": SAMPLING_LIMITS["repetition_penalty"],
    "seed": SAMPLING_LIMITS["seed"],
}
STOP = SAMPLING_LIMITS["stop"]
FIELDS = (*NUMBERS, "stop")


class SamplingError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param, self.message = param, message


def _number(name: str, value, limit: Limit):
    if isinstance(value, str):
        try:
            value = int(value) if limit.kind is int else float(value)
        except ValueError:
            raise SamplingError(name, f"{name} must be {limit.describe()}") from None
    if limit.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not limit.allows(value):
        raise SamplingError(name, f"{name} must be {limit.describe()}")
    return value


def _stop(value) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise SamplingError("stop", "stop must be a string or a list of strings")
    stops = [s for s in stops if s]
    if len(stops) > STOP.max_items:
        raise SamplingError("stop", f"stop takes at most {STOP.max_items} sequences")
    if any(not STOP.allows(len(s)) for s in stops):
        raise SamplingError("stop", f"each stop sequence must be at most {STOP.high} characters")
    return stops


def sampling_params(data: dict) -> dict:
    """The SamplingParams keyword arguments ``data`` sets (others keep the engine's defaults);
    max_tokens is always present (None: up to the context)."""
    params = {"max_tokens": None}
    for name, limit in NUMBERS.items():
        value = data.get(name)
        if value is not None and value != "":
            params[name] = _number(name, value, limit)
    stops = _stop(data["stop"]) if data.get("stop") not in (None, "", []) else []
    if stops:
        params["stop"] = stops
    return params
