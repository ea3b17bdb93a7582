"""The console's prices and budgets pages (staff): add a price (never edit one), set and delete
money budgets, see each budget's spend and its soft alert."""

from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.billing.models import MoneyBudget
from webapp.billing.money import format_money
from webapp.billing.selectors import budget_rows, price_list
from webapp.billing.services import HOLDER_FIELD, budget_delete, budget_set, price_set
from webapp.console.access import staff_required
from webapp.console.outcome import run_change
from webapp.keys.models import ApiKey
from webapp.orgs.models import Organisation, Team
from webapp.registry.models import Model

HOLDERS = {"key": ApiKey, "user": get_user_model(), "team": Team, "organisation": Organisation}


def _prices_page(request, status: int = 200):
    rows = [{"price": p, "input": format_money(p.input_nanos_per_million, p.currency),
             "cached": format_money(p.cached_input_nanos_per_million, p.currency),
             "output": format_money(p.output_nanos_per_million, p.currency)} for p in price_list()]
    return render(request, "console/prices.html", {"rows": rows, "models": Model.objects.order_by("slug"),
                                                   "page": "prices"}, status=status)


@staff_required
def prices_page(request):
    return _prices_page(request)


def _moment(text: str) -> datetime | None:
    """An ISO date-time from a datetime-local input (UTC), None when empty."""
    if not (text or "").strip():
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValidationError({"effective_from": f"effective_from must be a date and time, got {text[:30]!r}"})
    return moment if moment.tzinfo else moment.replace(tzinfo=dt_timezone.utc)


@staff_required
@require_POST
def price_add(request):
    model = get_object_or_404(Model, pk=request.POST.get("model") or 0)
    post = request.POST
    ok = run_change(request, lambda: price_set(
        model=model, currency=post.get("currency"), input_per_million=post.get("input_per_million"),
        output_per_million=post.get("output_per_million"),
        cached_input_per_million=post.get("cached_input_per_million") or None,
        effective_from=_moment(post.get("effective_from", "")), adapter=(post.get("adapter") or "").strip() or None),
        done=f"Price of {model.slug} added.", what="Price")
    return redirect("console:prices") if ok else _prices_page(request, status=400)


def _budgets_page(request, status: int = 200):
    return render(request, "console/budgets.html", {
        "rows": budget_rows(), "page": "budgets", "periods": MoneyBudget.Period.values, "levels": list(HOLDER_FIELD),
        "holders": {level: model.objects.all()[:500] for level, model in HOLDERS.items()}}, status=status)


@staff_required
def budgets_page(request):
    return _budgets_page(request)


@staff_required
@require_POST
def budget_add(request):
    post = request.POST
    level = post.get("level", "")
    model = HOLDERS.get(level)
    holder = get_object_or_404(model, pk=post.get(f"holder_{level}") or 0) if model else None
    budget = get_object_or_404(MoneyBudget, pk=post["budget"]) if post.get("budget") else None
    ok = run_change(request, lambda: budget_set(
        level=budget.level if budget else level, holder=holder, amount=post.get("amount"),
        currency=post.get("currency"), period=post.get("period", MoneyBudget.Period.TOTAL),
        alert_percent=post.get("alert_percent") or 80, budget=budget), done="Budget saved.", what="Budget")
    return redirect("console:budgets") if ok else _budgets_page(request, status=400)


@staff_required
@require_POST
def budget_remove(request, budget_id: int):
    budget = get_object_or_404(MoneyBudget, pk=budget_id)
    run_change(request, lambda: budget_delete(budget=budget), done="Budget deleted.", what="Deleting")
    return redirect("console:budgets")
