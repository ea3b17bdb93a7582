"""Writes of prices and money budgets, validated (a bad value is a ValidationError naming its
field) and audited."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.audit.services import audit_record, snapshot
from webapp.billing.budgets import period_start
from webapp.billing.models import MoneyBudget, Price
from webapp.billing.money import parse_amount, parse_currency
from webapp.registry.models import Model

# A price taking effect this far in the past is refused: requests admitted since were charged at
# the price then in force, and a price must never rewrite them. (A little slack for a form's time.)
BACKDATE_SLACK = timedelta(minutes=1)
HOLDER_FIELD = {"key": "api_key", "user": "user", "team": "team", "organisation": "organisation"}


def price_set(*, model: Model, currency, input_per_million, output_per_million, cached_input_per_million=None,
              effective_from: datetime | None = None, adapter: str | None = None) -> Price:
    """A new price for ``model`` (or its LoRA ``adapter``) per million tokens, from
    ``effective_from`` (default now; not in the past). The cached-input price defaults to the
    input price."""
    errors, values = {}, {}
    try:
        values["currency"] = parse_currency(currency)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    for field, value in (("input_per_million", input_per_million), ("output_per_million", output_per_million),
                         ("cached_input_per_million", cached_input_per_million)):
        if value is None or (isinstance(value, str) and not value.strip()):
            if field != "cached_input_per_million":
                errors[field] = [f"{field} is required"]
            continue
        try:
            values[field] = parse_amount(value, field=field)
        except ValidationError as exc:
            errors.update(exc.message_dict)
    now = timezone.now()
    effective_from = effective_from or now
    if effective_from < now - BACKDATE_SLACK:
        errors["effective_from"] = ["effective_from may not be in the past: past spend is never re-priced"]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        before = Price.objects.filter(model=model, adapter=adapter or None).order_by("-effective_from", "-pk").first()
        price = Price.objects.create(
            model=model, adapter=adapter or None, currency=values["currency"],
            input_nanos_per_million=values["input_per_million"],
            cached_input_nanos_per_million=values.get("cached_input_per_million", values["input_per_million"]),
            output_nanos_per_million=values["output_per_million"], effective_from=effective_from)
        audit_record(action="price.set", target=price, before=snapshot(before), after=snapshot(price))
    return price


def budget_set(*, level: str, holder, amount, currency, period: str = MoneyBudget.Period.TOTAL,
               alert_percent=80, budget: MoneyBudget | None = None) -> MoneyBudget:
    """Create a budget for ``holder`` (a key, user, team or organisation, by ``level``), or change
    ``budget``'s amount, currency, period or alert threshold (what it has spent stays)."""
    errors = {}
    if level not in HOLDER_FIELD:
        errors["level"] = [f"level must be one of {', '.join(HOLDER_FIELD)}"]
    if period not in MoneyBudget.Period.values:
        errors["period"] = [f"period must be one of {', '.join(MoneyBudget.Period.values)}"]
    values = {}
    try:
        values["amount_nanos"] = parse_amount(amount, field="amount", allow_zero=False)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    try:
        values["currency"] = parse_currency(currency)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    try:
        alert = int(str(alert_percent).strip())
        if not 1 <= alert <= 100:
            raise ValueError
    except (TypeError, ValueError):
        errors["alert_percent"] = [f"alert_percent must be a whole number from 1 to 100, got {str(alert_percent)[:20]!r}"]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        before = snapshot(budget)
        if budget is None:
            budget = MoneyBudget(level=level, **{HOLDER_FIELD[level]: holder})
        if budget.pk is not None and budget.currency != values["currency"] and budget.reserved_nanos:
            raise ValidationError({"currency": "running requests hold this budget: change its currency later"})
        budget.amount_nanos, budget.currency = values["amount_nanos"], values["currency"]
        if budget.pk is None or budget.period != period:  # what it spent counts from the current period on
            budget.period_start = period_start(period, timezone.now())
        budget.period, budget.alert_percent = period, alert
        budget.save()
        audit_record(action="budget.set", target=budget, before=before, after=snapshot(budget))
    return budget


def budget_delete(*, budget: MoneyBudget) -> None:
    with transaction.atomic():
        audit_record(action="budget.delete", target=budget, before=snapshot(budget), target_repr=str(budget))
        budget.delete()

