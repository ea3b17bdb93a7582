"""Reads of prices and budgets: the price list, each budget's state in its current period."""

from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from django.db.models import Q

from webapp.billing.budgets import budget_left, period_start
from webapp.billing.models import MoneyBudget, Price
from webapp.billing.money import format_money


def price_list() -> list[Price]:
    return list(Price.objects.select_related("model").order_by("model__slug", "adapter", "-effective_from", "-pk"))


def _row(budget: MoneyBudget, now: datetime) -> dict:
    start = period_start(budget.period, now)
    spent = 0 if start is not None and (budget.period_start is None or budget.period_start < start) \
        else budget.spent_nanos
    used = spent + budget.reserved_nanos
    ratio = used / budget.amount_nanos
    return {"budget": budget, "id": budget.pk, "level": budget.level, "holder": str(budget.holder),
            "period": budget.period, "currency": budget.currency, "amount": format_money(budget.amount_nanos,
                                                                                        budget.currency),
            "spent": format_money(spent, budget.currency), "reserved": format_money(budget.reserved_nanos,
                                                                                    budget.currency),
            "left": format_money(budget_left(budget, now), budget.currency), "left_nanos": budget_left(budget, now),
            "ratio": ratio,
            "percent": round(100 * ratio, 1), "alerting": 100 * ratio >= budget.alert_percent,
            "alert_percent": budget.alert_percent}


def budget_rows(*, budgets=None, now: datetime | None = None) -> list[dict]:
    """One row per budget (all, or those given): spent, held and left in its current period, and
    whether it has reached its alert threshold."""
    now = now or datetime.now(dt_timezone.utc)
    if budgets is None:
        budgets = MoneyBudget.objects.select_related("api_key", "user", "team__organisation", "organisation")
    return [_row(budget, now) for budget in budgets]


def budgets_of_member(*, user) -> list[MoneyBudget]:
    """The budgets a member sees: their own, their keys', their teams' and their organisations'."""
    teams = list(user.memberships.values_list("team_id", flat=True))
    return list(MoneyBudget.objects.filter(
        Q(user=user) | Q(api_key__owner=user) | Q(api_key__team__in=teams) | Q(team__in=teams)
        | Q(organisation__teams__in=teams)).select_related(
        "api_key", "user", "team__organisation", "organisation").distinct().order_by("level", "pk"))
