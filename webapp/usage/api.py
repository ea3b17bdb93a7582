"""GET /v1/usage: what the calling API key has used and spent, and what its budgets have left.

Read-only and scoped to the caller: the key in the Authorization header sees its own requests
(the last ``days``, default 30, within the raw records' retention) grouped by model, and the money
budgets that bound it (its own, its owner's, its team's, its organisation's). Errors are OpenAI
error objects.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone as dt_timezone

from django.db.models import Q
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from webapp.billing.budgets import budgets_for
from webapp.billing.money import to_decimal
from webapp.billing.selectors import budget_rows
from webapp.keys.selectors import apikey_get_usable
from webapp.openai_api import errors
from webapp.usage.selectors import usage_scoped_totals_by

MAX_DAYS = 3650
COLUMNS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "total_tokens",
           "running")


def _spend(spend: dict[str, int]) -> dict[str, str]:
    return {currency: str(to_decimal(nanos)) for currency, nanos in sorted(spend.items())}


def _days(raw: str | None) -> int:
    if raw is None:
        return 30
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_DAYS:
        raise errors.invalid_parameter("days", f"days must be a whole number from 1 to {MAX_DAYS}")
    return int(raw)


@never_cache
@require_safe
def usage_retrieve(request):
    try:
        scheme, _, raw_key = request.headers.get("Authorization", "").partition(" ")
        api_key = apikey_get_usable(raw_key=raw_key.strip()) if scheme.lower() == "bearer" and raw_key.strip() else None
        if api_key is None:
            raise errors.invalid_api_key("Incorrect, revoked or expired API key provided.")
        days = _days(request.GET.get("days"))
    except errors.OpenAIError as error:
        return error.response()
    today = datetime.now(dt_timezone.utc).date()
    since = datetime.combine(today - timedelta(days=days - 1), time.min, tzinfo=dt_timezone.utc)
    rows = usage_scoped_totals_by(group="model", scope=Q(api_key=api_key), since=since)
    totals = {column: sum(row[column] for row in rows) for column in COLUMNS}
    spend: dict[str, int] = {}
    for row in rows:
        for currency, nanos in row["spend"].items():
            spend[currency] = spend.get(currency, 0) + nanos
    return JsonResponse({
        "object": "usage", "since": since.isoformat(), "days": days,
        "key": {"name": api_key.name, "prefix": api_key.prefix, "team": api_key.team.name if api_key.team else None},
        "data": [{"model": row["model_name"], **{c: row[c] for c in COLUMNS}, "spend": _spend(row["spend"])}
                 for row in rows],
        "totals": {**totals, "spend": _spend(spend)},
        "budgets": [{"level": row["level"], "holder": row["holder"], "period": row["period"],
                     "currency": row["currency"], "amount": str(to_decimal(row["budget"].amount_nanos)),
                     "left": str(to_decimal(row["left_nanos"])), "percent_used": row["percent"], "alerting": row["alerting"]}
                    for row in budget_rows(budgets=budgets_for(api_key))]})
