"""The API's per-key limits: admit a request (or say why not and when to retry), release it.

Checked in this order, each before any work is done for the request: the lifetime token budget,
tokens per minute, concurrent requests, requests per minute. A request that is refused takes
nothing: its concurrency slot is given back and it does not count in the minute's requests.
Tokens (prompt + completion, as the engine counted them) are charged when the request ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.db.models import F

from webapp.keys.limits import get_limit_store, seconds_left
from webapp.keys.models import ApiKey

RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
BUDGET_EXHAUSTED = "budget_exhausted"


@dataclass
class LimitExceeded(Exception):
    code: str  # RATE_LIMIT_EXCEEDED or BUDGET_EXHAUSTED
    message: str
    retry_after: int | None  # seconds; None when waiting will not help (the budget is spent)

    def __str__(self) -> str:
        return self.message


def _names(api_key: ApiKey) -> tuple[str, str, str]:
    # By hash, not pk: a pk may be reused after a delete (SQLite), and the counters must not be.
    base = api_key.key_hash[:24]
    return f"{base}:requests", f"{base}:tokens", f"{base}:running"


def apikey_admit(*, api_key: ApiKey, request_id: str, now: float | None = None) -> None:
    """Admit one request under the key's limits; LimitExceeded otherwise."""
    now = time.time() if now is None else now
    store = get_limit_store()
    requests_name, tokens_name, running_name = _names(api_key)
    if api_key.token_budget is not None:
        used = ApiKey.objects.filter(pk=api_key.pk).values_list("tokens_used", flat=True).first() or 0
        if used >= api_key.token_budget:
            raise LimitExceeded(BUDGET_EXHAUSTED, f"This API key has used its token budget of "
                                f"{api_key.token_budget} tokens.", None)
    if api_key.max_tokens_per_minute is not None:
        used = store.window_total(tokens_name, now)
        if used >= api_key.max_tokens_per_minute:
            raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: {used} of "
                                f"{api_key.max_tokens_per_minute} tokens per minute used.", seconds_left(now))
    limit = api_key.max_concurrent_requests
    if limit is not None and not store.slot_take(running_name, request_id, limit, now):
        raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: {limit} concurrent requests "
                            f"already running.", 1)
    if api_key.max_requests_per_minute is not None:
        retry_after = store.window_take(requests_name, api_key.max_requests_per_minute, now)
        if retry_after is not None:
            if limit is not None:
                store.slot_release(running_name, request_id)
            raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: "
                                f"{api_key.max_requests_per_minute} requests per minute.", retry_after)


def apikey_release(*, api_key: ApiKey, request_id: str, tokens: int = 0, now: float | None = None) -> None:
    """The request ended: free its slot (idempotent) and charge its tokens."""
    now = time.time() if now is None else now
    store = get_limit_store()
    _, tokens_name, running_name = _names(api_key)
    if api_key.max_concurrent_requests is not None:
        store.slot_release(running_name, request_id)
    if tokens > 0:
        if api_key.max_tokens_per_minute is not None:
            store.window_add(tokens_name, tokens, now)
        ApiKey.objects.filter(pk=api_key.pk).update(tokens_used=F("tokens_used") + tokens)


def apikey_running_requests(*, api_key: ApiKey) -> int:
    return get_limit_store().slot_count(_names(api_key)[2])
