"""Budgets in money: reserve a request's worst-case cost at admission, settle its real cost at its end.

The same guarantee as token budgets (webapp.keys.enforcement): every budget that bounds the
request (its key's, its owner's, its team's, its organisation's) takes the worst case with one
conditional UPDATE (``spent + reserved + worst <= amount``), all of them in one transaction, in
the order of their ids (two requests never wait for each other's rows in opposite orders); the
first that cannot take it rolls the others back and is named in the refusal. The database decides,
so it holds across every web process; PostgreSQL re-checks the condition on the row it locked,
SQLite serializes writers. A MoneyReservation row per budget names the request and its process,
so a killed process's reservations are given back when a budget looks full (as token ones are).

A periodic budget's ``spent`` restarts at the start of each UTC day, week (Monday) or month: the
first reservation or settlement after that moment moves ``period_start`` and zeroes ``spent``
with one conditional UPDATE (exactly one request does it). Reservations running across the
boundary are settled into the new period.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone

from django.db import transaction
from django.db.models import F, Q

from webapp.billing.models import MoneyBudget, MoneyReservation, Price
from webapp.billing.money import format_money
from webapp.billing.pricing import most_expensive_price, price_in_force, worst_case_cost
from webapp.keys.models import ApiKey, ChatLimits


@dataclass
class BudgetExceeded(Exception):
    level: str  # key, user, team or organisation
    message: str

    def __str__(self) -> str:
        return self.message


def budgets_for(subject) -> list[MoneyBudget]:
    """The budgets bounding a request of ``subject`` (an ApiKey, or a ChatLimits for chat turns:
    its user's budgets), by id."""
    if isinstance(subject, ApiKey):
        holders = Q(api_key_id=subject.pk) | Q(user_id=subject.owner_id)
        if subject.team_id is not None:
            holders |= Q(team_id=subject.team_id) | Q(organisation__teams=subject.team_id)
    elif isinstance(subject, ChatLimits):
        holders = Q(user_id=subject.user_id)
    else:
        return []
    return list(MoneyBudget.objects.filter(holders).select_related(
        "api_key", "user", "team__organisation", "organisation").distinct().order_by("pk"))


def period_start(period: str, now: datetime) -> datetime | None:
    """The start (UTC) of the period ``now`` is in; None for a budget that never resets."""
    day = now.astimezone(dt_timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == MoneyBudget.Period.DAILY:
        return day
    if period == MoneyBudget.Period.WEEKLY:
        return day - timedelta(days=day.weekday())
    if period == MoneyBudget.Period.MONTHLY:
        return day.replace(day=1)
    return None


def _roll(budget: MoneyBudget, now: datetime) -> None:
    """Start the budget's current period if it has not started yet (zero what it has spent)."""
    start = period_start(budget.period, now)
    if start is not None and (budget.period_start is None or budget.period_start < start):
        MoneyBudget.objects.filter(Q(period_start__isnull=True) | Q(period_start__lt=start), pk=budget.pk).update(
            spent_nanos=0, period_start=start)


def describe(budget: MoneyBudget) -> str:
    """"the monthly budget of the team 'acme / ml' (100.00 USD)": the level and holder named."""
    period = "" if budget.period == MoneyBudget.Period.TOTAL else f"{budget.period} "
    return f"the {period}budget of the {budget.level} '{budget.holder}' " \
           f"({format_money(budget.amount_nanos, budget.currency)})"


class _Refused(Exception):
    def __init__(self, budget: MoneyBudget) -> None:
        self.budget = budget


def _reserve_all(budgets: list[MoneyBudget], request_id: str, worst: int, now: datetime, process: str) -> None:
    with transaction.atomic():
        for budget in budgets:
            _roll(budget, now)
            taken = MoneyBudget.objects.filter(
                pk=budget.pk, amount_nanos__gte=F("spent_nanos") + F("reserved_nanos") + worst,
            ).update(reserved_nanos=F("reserved_nanos") + worst)
            if not taken:
                raise _Refused(budget)  # rolls back what the others took
            MoneyReservation.objects.create(request_id=request_id, budget=budget, amount_nanos=worst,
                                            created_at=now, process_id=process)


def _give_back(reservations: list[MoneyReservation]) -> None:
    """End these reservations (each once, whoever deletes it) and lower their budgets' reserved."""
    freed: dict[int, int] = defaultdict(int)
    for reservation in reservations:
        if MoneyReservation.objects.filter(pk=reservation.pk).delete()[0]:
            freed[reservation.budget_id] += reservation.amount_nanos
    for budget_id in sorted(freed):
        MoneyBudget.objects.filter(pk=budget_id).update(reserved_nanos=F("reserved_nanos") - freed[budget_id])


def _sweep_stale(budget: MoneyBudget, now: datetime, alive, max_age_s: float) -> int:
    """Give back the budget's reservations whose process has no lease, or older than any request runs."""
    rows = list(MoneyReservation.objects.filter(budget=budget))
    living = alive({r.process_id for r in rows if r.process_id})
    stale = [r for r in rows if r.created_at < now - timedelta(seconds=max_age_s)
             or (r.process_id and r.process_id not in living)]
    if stale:
        with transaction.atomic():
            _give_back(stale)
    return len(stale)


def request_price(*, model_id: int | None, now: datetime) -> Price | None:
    return price_in_force(model_id=model_id, at=now) if model_id is not None else most_expensive_price(at=now)


def money_reserve(*, subject, request_id: str, tokens: int, model_id: int | None, num_prompt_tokens: int | None,
                  now: datetime, lease, alive, max_age_s: float) -> int:
    """Hold the request's worst-case cost against every budget bounding ``subject``; returns it
    (0: no budget, or an unpriced model). BudgetExceeded names the level that refused.
    ``lease()`` renews and names this process; ``alive(ids)`` says which processes hold a lease."""
    budgets = budgets_for(subject)
    if not budgets:
        return 0
    price = request_price(model_id=model_id, now=now)
    if price is None:
        return 0
    worst = worst_case_cost(price=price, tokens=tokens, num_prompt_tokens=num_prompt_tokens)
    for budget in budgets:
        if budget.currency != price.currency:
            raise BudgetExceeded(budget.level, f"This model is priced in {price.currency} and {describe(budget)} "
                                 f"is in {budget.currency}: it cannot pay for it.")
    if worst == 0:
        return 0
    process = lease()
    try:
        _reserve_all(budgets, request_id, worst, now, process)
    except _Refused as refused:
        if not _sweep_stale(refused.budget, now, alive, max_age_s):
            raise _exceeded(refused.budget, worst) from None
        try:
            _reserve_all(budgets, request_id, worst, now, process)
        except _Refused as again:
            raise _exceeded(again.budget, worst) from None
    return worst


def _exceeded(budget: MoneyBudget, worst: int) -> BudgetExceeded:
    budget.refresh_from_db(fields=["spent_nanos", "reserved_nanos"])
    held = (f" and {format_money(budget.reserved_nanos, budget.currency)} held by running requests"
            if budget.reserved_nanos else "")
    return BudgetExceeded(budget.level, f"Budget exceeded: this request may cost up to "
                          f"{format_money(worst, budget.currency)} and {describe(budget)} has "
                          f"{format_money(budget.spent_nanos, budget.currency)} spent{held}.")


def money_settle(*, subject, request_id: str, cost_nanos: int = 0, currency: str = "",
                 now: datetime | None = None) -> None:
    """The request ended: give back its reservations and charge ``cost_nanos`` to every budget in
    ``currency`` bounding ``subject`` now (once per call: make one). Nothing held and nothing to
    charge (most refusals): one read, no transaction."""
    if not cost_nanos and not MoneyReservation.objects.filter(request_id=request_id).exists():
        return
    now = now or datetime.now(dt_timezone.utc)
    with transaction.atomic():
        _give_back(list(MoneyReservation.objects.filter(request_id=request_id)))
        if cost_nanos:
            for budget in budgets_for(subject):
                if budget.currency == currency:
                    _roll(budget, now)
                    MoneyBudget.objects.filter(pk=budget.pk).update(spent_nanos=F("spent_nanos") + cost_nanos)


def budget_left(budget: MoneyBudget, now: datetime | None = None) -> int:
    """What the budget has left in its current period (nano-units; reservations count as spent)."""
    start = period_start(budget.period, now or datetime.now(dt_timezone.utc))
    spent = 0 if start is not None and (budget.period_start is None or budget.period_start < start) \
        else budget.spent_nanos
    return max(0, budget.amount_nanos - spent - budget.reserved_nanos)
