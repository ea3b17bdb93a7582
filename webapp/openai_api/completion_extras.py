"""The legacy /v1/completions' ``echo``, ``suffix`` and ``best_of``.

- ``suffix``: the prompt and the suffix in the model's fill-in-the-middle layout, when its
  tokenizer has one of the known FIM token triples (StarCoder / SmolLM, Qwen2.5-Coder, CodeLlama);
  else a 400 naming ``suffix``, as the model cannot fill in a middle.
- ``suffix`` with a list of prompts: each prompt gets the same suffix.
- ``echo``: each choice's text starts with its own prompt's (not with ``logprobs``: the engine gives
  no prompt log-probabilities, refused with a 400 rather than answered without them).
- ``best_of``: ``best_of`` samples run (``n`` = best_of in the engine, all billed, as OpenAI bills
  them) and the ``n`` with the highest total log-probability are answered; not streamed, as OpenAI.
"""

from __future__ import annotations

from rest_framework import serializers

from webapp.openai_api import errors
from webapp.registry.tokenizers import ModelTokenizer
from webapp.usage.outcome import ChoiceOutcome

FIM_TOKENS = (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
              ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
              ("<PRE>", "<SUF>", "<MID>"))


def check_extras(attrs: dict, max_n: int, max_sequences: int) -> None:
    """The three parameters' rules among the body's others, and the list of prompts' bound: at
    most ``max_sequences`` sequences (prompts x max(n, best_of)) in all (ValidationError naming the field)."""
    n, best_of = attrs.get("n") or 1, attrs.get("best_of")
    num_sequences = len(attrs["prompt"]) * max(n, best_of or 1)
    if num_sequences > max_sequences:
        raise serializers.ValidationError({"prompt": (
            f"{len(attrs['prompt'])} prompts x {max(n, best_of or 1)} samples each is {num_sequences} "
            f"sequences; at most {max_sequences} per request")})
    if best_of is not None:
        if not n <= best_of <= max_n:
            raise serializers.ValidationError({"best_of": f"must be from n ({n}) to {max_n}"})
        if attrs.get("stream") and best_of > n:
            raise serializers.ValidationError({"best_of": "cannot be used with stream when greater than n"})
    if attrs.get("echo") and attrs.get("logprobs") is not None:
        raise serializers.ValidationError({"echo": "cannot be combined with logprobs here (no prompt logprobs)"})
    if attrs.get("suffix") and not all(isinstance(p, str) for p in attrs["prompt"]):
        raise serializers.ValidationError({"suffix": "needs text prompts"})


def fim_prompt(tokenizer: ModelTokenizer, prompt: str, suffix: str) -> list[int]:
    """The fill-in-the-middle prompt's token ids; 400 when the model has no FIM tokens."""
    for prefix_token, suffix_token, middle_token in FIM_TOKENS:
        ids = [tokenizer.tokenizer.token_to_id(t) for t in (prefix_token, suffix_token, middle_token)]
        if None not in ids:
            pre, suf = (tokenizer.encode(text, add_special_tokens=False) for text in (prompt, suffix))
            return [ids[0], *pre, ids[1], *suf, ids[2]]
    raise errors.invalid_parameter("suffix", "This model has no fill-in-the-middle tokens, so it cannot complete "
                                             "between a prompt and a suffix.")


def best_choices(choices: list[ChoiceOutcome], n: int) -> list[ChoiceOutcome]:
    """The ``n`` samples of the highest total log-probability, best first."""
    return sorted(choices, key=lambda c: -sum(e["logprob"] for e in c.logprobs))[:n]
