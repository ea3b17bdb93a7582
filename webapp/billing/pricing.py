"""The price in force for a model (or one of its LoRA adapters) at a moment, and what tokens cost at it."""

from __future__ import annotations

from datetime import datetime

from webapp.billing.models import Price
from webapp.billing.money import cost_nanos


def price_in_force(*, model_id: int | None, at: datetime, adapter: str | None = None) -> Price | None:
    """The latest price taking effect at or before ``at``: the adapter's own, else the base model's."""
    if model_id is None:
        return None
    prices = Price.objects.filter(model_id=model_id, effective_from__lte=at).order_by("-effective_from", "-pk")
    if adapter:
        own = prices.filter(adapter=adapter).first()
        if own is not None:
            return own
    return prices.filter(adapter__isnull=True).first()


def most_expensive_price(*, at: datetime) -> Price | None:
    """Of the prices in force at ``at``, the one charging most per token (the worst case of a
    request whose model is not known to the caller)."""
    latest: dict[tuple, Price] = {}
    for price in Price.objects.filter(effective_from__lte=at).order_by("effective_from", "pk"):
        latest[(price.model_id, price.adapter)] = price
    return max(latest.values(), key=_dearest_rate, default=None)


def _dearest_rate(price: Price) -> int:
    return max(price.input_nanos_per_million, price.cached_input_nanos_per_million, price.output_nanos_per_million)


def record_cost(*, price: Price, prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int) -> int:
    """One request's cost in nano-units: uncached prompt tokens at the input price, cached ones at
    the cached-input price, completion tokens at the output price; rounded once."""
    cached = min(cached_prompt_tokens, prompt_tokens)
    exact_micro = ((prompt_tokens - cached) * price.input_nanos_per_million
                   + cached * price.cached_input_nanos_per_million
                   + completion_tokens * price.output_nanos_per_million)
    return cost_nanos(1, exact_micro)


def worst_case_cost(*, price: Price, tokens: int, num_prompt_tokens: int | None) -> int:
    """The most a request holding ``tokens`` (webapp.keys.enforcement.worst_case_tokens, times n)
    can cost, rounded up: its prompt at the dearer input price, the rest at the output price; with
    the prompt unknown, every token at the dearest of the three."""
    if num_prompt_tokens is None:
        return cost_nanos(tokens, _dearest_rate(price), worst=True)
    prompt = min(num_prompt_tokens, tokens)
    input_rate = max(price.input_nanos_per_million, price.cached_input_nanos_per_million)
    return cost_nanos(1, prompt * input_rate + (tokens - prompt) * price.output_nanos_per_million, worst=True)


def record_charge(*, model_id: int | None, at: datetime, prompt_tokens: int, cached_prompt_tokens: int,
                  completion_tokens: int, adapter: str | None = None) -> dict:
    """A usage record's cost fields (cost_nanos, currency, price_id) for its counts at ``at``'s price;
    an unpriced model costs 0 with no currency."""
    price = price_in_force(model_id=model_id, at=at, adapter=adapter)
    if price is None:
        return {"cost_nanos": 0, "currency": "", "price_id": None}
    return {"cost_nanos": record_cost(price=price, prompt_tokens=prompt_tokens,
                                      cached_prompt_tokens=cached_prompt_tokens, completion_tokens=completion_tokens),
            "currency": price.currency, "price_id": price.pk}
