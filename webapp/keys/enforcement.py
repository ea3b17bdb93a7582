"""Limits of API keys and chat users: admit a request, reserve its worst case, settle it when it ends.

A *subject* is an ApiKey or a ChatLimits row: both have max_requests_per_minute,
max_tokens_per_minute, max_concurrent_requests, token_budget, tokens_used, tokens_reserved and a
``counter_name`` (null limits: unlimited). One request goes through three steps:

1. ``limits_admit``, before any work: the budget is not spent, a concurrency slot is free, the
   requests-per-minute window has room (each is taken atomically in the limit store).
2. ``limits_reserve``, once the prompt is tokenized: its worst case (``worst_case_tokens``: prompt
   + max_tokens, or the whole context when max_tokens is absent) goes into the tokens-per-minute
   window and against the budget, before the request is scheduled.
3. ``limits_release``, however it ended: the slot is freed and the real count replaces the worst
   case in the window and the budget (the unused part is given back).

The budget's reservation is a conditional UPDATE of the subject's row
(``tokens_used + tokens_reserved + worst <= token_budget``) in the same transaction as a
TokenReservation row naming the request: atomic across every web process (the database decides,
Postgres re-checks the condition on the locked row, SQLite serializes writers), and the budget
stays where its spent tokens are, in the database, so losing Redis cannot reset it. A process that
dies mid-request leaves its row; a row whose process has no lease any more (webapp.keys.leases:
killed, or a previous run of the server) or older than SLOT_TTL_S is given back when a budget
looks full (the only moment they matter). A request refused at any step takes nothing.

The limit store unreachable (Redis down in distributed mode): ``limits_admit`` and
``limits_reserve`` raise limits.LimitStoreUnavailable (the request is refused, 503 for the API,
having taken nothing it keeps); ``limits_release`` still settles the budget in the database and
writes nothing off: the store defers its own give-backs (see webapp.keys.limits).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone

from django.db import transaction
from django.db.models import F

from webapp.billing.budgets import BudgetExceeded, money_reserve, money_settle
from webapp.keys.limits import SLOT_TTL_S, LimitStoreUnavailable, get_limit_store
from webapp.keys.models import ApiKey, ChatLimits, TokenReservation
from webapp.orgs.models import Team

RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
BUDGET_EXHAUSTED = "budget_exhausted"
# Context length assumed for the worst case when neither the version's engine settings nor its
# tokenizer export says (the bundled SmolLM2's).
DEFAULT_CONTEXT_TOKENS = 8192
CONCURRENCY_RETRY_S = 1  # a slot frees when a running request ends, which nobody can foresee: poll


@dataclass
class LimitExceeded(Exception):
    code: str  # RATE_LIMIT_EXCEEDED or BUDGET_EXHAUSTED
    message: str
    retry_after: int | None  # seconds; None when waiting alone will not help

    def __str__(self) -> str:
        return self.message


class PriorityNotAllowed(Exception):
    """A request asked for a priority its key may not set."""


Subject = ApiKey | ChatLimits


def _names(subject: Subject) -> tuple[str, str, str]:
    base = subject.counter_name
    return f"{base}:requests", f"{base}:tokens", f"{base}:running"


def _seconds(wait: float) -> int:
    return max(1, math.ceil(wait))


def worst_case_tokens(*, num_prompt_tokens: int, max_tokens: int | None, max_model_len: int | None) -> int:
    """The most tokens a request can be charged: prompt + max_tokens, or the context it may fill."""
    if max_tokens:
        return num_prompt_tokens + max_tokens
    return max(num_prompt_tokens, max_model_len or DEFAULT_CONTEXT_TOKENS)


def _subjects(subject: Subject) -> list:
    """The subject and what bounds it beside: a team key's team (its rates and concurrency)."""
    if isinstance(subject, ApiKey) and subject.team_id is not None:
        return [subject, subject.team]
    return [subject]


@contextmanager
def _naming(subject):
    """A team's refusal says it is the team's limit (a key's own says nothing more, as before)."""
    try:
        yield
    except LimitExceeded as exc:
        if isinstance(subject, Team):
            exc.message = f"The team {subject.name!r}'s limit: {exc.message}"
        raise


def _undo(subject, request_id: str) -> None:
    """Give back whatever a refused request took from ``subject`` (each part idempotent)."""
    store = get_limit_store()
    requests_name, tokens_name, running_name = _names(subject)
    store.window_cancel(tokens_name, request_id)
    store.window_cancel(requests_name, request_id)  # a refused request does not count
    if subject.max_concurrent_requests is not None:
        store.slot_release(running_name, request_id)
    if subject.token_budget is not None:
        _budget_give_back(subject, request_id, 0)


def limits_admit(*, subject: Subject, request_id: str, now: float | None = None) -> None:
    """Admit one request under the subject's limits, and its team's for a team key; LimitExceeded
    otherwise (having taken nothing)."""
    now = time.time() if now is None else now
    admitted = []
    try:
        for one in _subjects(subject):
            with _naming(one):
                _admit_one(one, request_id, now)
            admitted.append(one)
    except (LimitExceeded, LimitStoreUnavailable):
        for one in admitted:
            _undo(one, request_id)
        raise


def _admit_one(subject, request_id: str, now: float) -> None:
    store = get_limit_store()
    requests_name, _, running_name = _names(subject)
    if subject.token_budget is not None:
        used = type(subject).objects.filter(pk=subject.pk).values_list("tokens_used", flat=True).first() or 0
        if used >= subject.token_budget:
            raise LimitExceeded(BUDGET_EXHAUSTED, f"The token budget of {subject.token_budget} tokens is "
                                "used up.", None)
    limit = subject.max_concurrent_requests
    if limit is not None and not store.slot_take(running_name, request_id, limit, now):
        raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: {limit} concurrent requests "
                            f"already running.", CONCURRENCY_RETRY_S)
    if subject.max_requests_per_minute is not None:
        try:
            wait = store.window_reserve(requests_name, request_id, 1, subject.max_requests_per_minute, now)
        except LimitStoreUnavailable:
            if limit is not None:
                store.slot_release(running_name, request_id)  # deferred by the store while it is unreachable
            raise
        if wait is not None:
            if limit is not None:
                store.slot_release(running_name, request_id)
            raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: {subject.max_requests_per_minute} "
                                f"requests per minute.", _seconds(wait))


def _reservation_owner(subject: Subject) -> dict:
    return {"api_key": subject} if isinstance(subject, ApiKey) else {"chat_limits": subject}


def _utc(now: float) -> datetime:
    return datetime.fromtimestamp(now, tz=dt_timezone.utc)


def _budget_reserve(subject: Subject, request_id: str, tokens: int, now: float) -> bool:
    process = get_limit_store().lease()  # before the row names it (LimitStoreUnavailable: nothing taken)
    with transaction.atomic():
        taken = type(subject).objects.filter(
            pk=subject.pk, token_budget__gte=F("tokens_used") + F("tokens_reserved") + tokens,
        ).update(tokens_reserved=F("tokens_reserved") + tokens)
        if taken:
            TokenReservation.objects.create(request_id=request_id, tokens=tokens, created_at=_utc(now),
                                            process_id=process, **_reservation_owner(subject))
    return bool(taken)


def _budget_give_back(subject: Subject, request_id: str, tokens_used: int) -> None:
    """End a reservation (once, whoever gets here first) and charge ``tokens_used``.

    Nothing to charge and no reservation (a refused request: most of a burst): one read, no
    transaction, which on SQLite (BEGIN IMMEDIATE) would take the database's write lock."""
    if not tokens_used and not TokenReservation.objects.filter(request_id=request_id).exists():
        return
    with transaction.atomic():
        reservation = TokenReservation.objects.filter(request_id=request_id).first()
        reserved = 0
        if reservation is not None and TokenReservation.objects.filter(pk=reservation.pk).delete()[0]:
            reserved = reservation.tokens
        if reserved or tokens_used:
            type(subject).objects.filter(pk=subject.pk).update(tokens_reserved=F("tokens_reserved") - reserved,
                                                               tokens_used=F("tokens_used") + tokens_used)


def _sweep_stale_reservations(subject: Subject, now: float) -> int:
    """Give back the reservations nobody will settle: their process lost its lease, or they are
    older than any request may run. Returns how many."""
    rows = list(TokenReservation.objects.filter(**_reservation_owner(subject))
                .values_list("request_id", "process_id", "created_at"))
    alive = get_limit_store().processes_alive({p for _, p, _ in rows if p})
    oldest = _utc(now - SLOT_TTL_S)
    stale = [r for r, p, at in rows if at < oldest or (p and p not in alive)]
    for request_id in stale:
        _budget_give_back(subject, request_id, 0)
    return len(stale)


def limits_reserve(*, subject: Subject, request_id: str, tokens: int, now: float | None = None,
                   model_id: int | None = None, num_prompt_tokens: int | None = None) -> None:
    """Hold ``tokens`` (the request's worst case) against the token rate and the budget of the
    subject and its team, and the worst case's cost (at ``model_id``'s price; the dearest price
    when it is not given) against every money budget bounding it (webapp.billing.budgets). On
    refusal (LimitExceeded) the request gives back everything it took at admission too."""
    now = time.time() if now is None else now
    store = get_limit_store()
    subjects = _subjects(subject)
    try:
        for one in subjects:
            with _naming(one):
                _reserve_one(one, request_id, tokens, now)
        try:
            money_reserve(subject=subject, request_id=request_id, tokens=tokens, model_id=model_id,
                          num_prompt_tokens=num_prompt_tokens, now=_utc(now), lease=store.lease,
                          alive=store.processes_alive, max_age_s=SLOT_TTL_S)
        except BudgetExceeded as exc:
            raise LimitExceeded(BUDGET_EXHAUSTED, exc.message, None) from exc
    except (LimitExceeded, LimitStoreUnavailable):
        for one in subjects:
            _undo(one, request_id)
        raise


def _reserve_one(subject, request_id: str, tokens: int, now: float) -> None:
    store = get_limit_store()
    _, tokens_name, _ = _names(subject)
    if subject.max_tokens_per_minute is not None:
        limit = subject.max_tokens_per_minute
        wait = store.window_reserve(tokens_name, request_id, tokens, limit, now)
        if wait == math.inf:
            raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Request too large: it may use {tokens} tokens "
                                f"(prompt + max_tokens), more than the limit of {limit} tokens per minute. "
                                f"Lower max_tokens or shorten the prompt.", None)
        if wait is not None:
            raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: this request may use {tokens} "
                                f"tokens and the limit is {limit} tokens per minute.", _seconds(wait))
    if subject.token_budget is not None and not _budget_reserve(subject, request_id, tokens, now):
        if not (_sweep_stale_reservations(subject, now) and _budget_reserve(subject, request_id, tokens, now)):
            row = type(subject).objects.filter(pk=subject.pk).values("tokens_used", "tokens_reserved").first()
            left = max(0, subject.token_budget - row["tokens_used"] - row["tokens_reserved"])
            raise LimitExceeded(BUDGET_EXHAUSTED, f"This request may use {tokens} tokens (prompt + max_tokens) "
                                f"and {left} of the token budget of {subject.token_budget} are free"
                                + (f" ({row['tokens_reserved']} held by running requests)."
                                   if row["tokens_reserved"] else ". Lower max_tokens."), None)


def limits_release(*, subject: Subject, request_id: str, tokens: int = 0, cost_nanos: int = 0,
                   currency: str = "") -> None:
    """The request ended (or was refused): free its slots (the subject's and its team's), settle its
    real ``tokens`` and its cost (``cost_nanos`` in ``currency``, charged to the money budgets
    bounding it). Idempotent for the slots and the reservations; the tokens and the cost are
    charged by each call (make one). The limit store unreachable, it still returns (the store
    defers the slot and the window, logging a warning) and the budgets, in the database, are
    settled all the same."""
    store = get_limit_store()
    try:
        for one in _subjects(subject):
            _, tokens_name, running_name = _names(one)
            if one.max_concurrent_requests is not None:
                store.slot_release(running_name, request_id)
            if one.max_tokens_per_minute is not None:
                store.window_settle(tokens_name, request_id, tokens)
    finally:
        _budget_give_back(subject, request_id, tokens)
        money_settle(subject=subject, request_id=request_id, cost_nanos=cost_nanos, currency=currency)


def limits_running_requests(*, subject: Subject) -> int:
    return get_limit_store().slot_count(_names(subject)[2])


def apikey_priority(*, api_key: ApiKey, requested: int | None) -> int:
    """The priority the engine gets: the requested one for keys allowed to set it; 0 (the
    default) for any key; PriorityNotAllowed for another value from a key without the right."""
    if not requested:
        return 0
    if not api_key.can_set_priority:
        raise PriorityNotAllowed("This API key may not set priority; send 0 or leave it out.")
    return requested


# The API's names for the same steps.

def apikey_admit(*, api_key: ApiKey, request_id: str, now: float | None = None) -> None:
    limits_admit(subject=api_key, request_id=request_id, now=now)


def apikey_reserve(*, api_key: ApiKey, request_id: str, tokens: int, now: float | None = None,
                   model_id: int | None = None, num_prompt_tokens: int | None = None) -> None:
    limits_reserve(subject=api_key, request_id=request_id, tokens=tokens, now=now, model_id=model_id,
                   num_prompt_tokens=num_prompt_tokens)


def apikey_release(*, api_key: ApiKey, request_id: str, tokens: int = 0, now: float | None = None) -> None:
    limits_release(subject=api_key, request_id=request_id, tokens=tokens)


def apikey_running_requests(*, api_key: ApiKey) -> int:
    return limits_running_requests(subject=api_key)


def apikey_background_take(*, api_key: ApiKey, request_id: str, limit: int) -> None:
    """A place among the key's background work (the Responses API's ``background``), across every
    web process: at most ``limit`` at once, whatever the key's concurrency limit (which it also
    counts against while it runs). LimitExceeded when full; LimitStoreUnavailable as the others."""
    if not get_limit_store().slot_take(f"{api_key.counter_name}:background", request_id, limit, time.time()):
        raise LimitExceeded(RATE_LIMIT_EXCEEDED, f"Rate limit reached: {limit} background responses already "
                            "running for this key.", CONCURRENCY_RETRY_S)


def apikey_background_release(*, api_key: ApiKey, request_id: str) -> None:
    get_limit_store().slot_release(f"{api_key.counter_name}:background", request_id)


def apikey_background_count(*, api_key: ApiKey) -> int:
    return get_limit_store().slot_count(f"{api_key.counter_name}:background")
