"""The admin console's pages (staff only). Thin: rows come from selectors."""

from __future__ import annotations

import csv
from datetime import datetime, time, timedelta, timezone as dt_timezone

from django.conf import settings
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from webapp.console.access import staff_required
from webapp.console.selectors import models_without_worker, worker_rows
from webapp.billing.money import format_spend, to_decimal
from webapp.usage.selectors import (GROUPS, RAW_ONLY_GROUPS, TOTAL_COLUMNS, usage_daily_series, usage_daily_spend,
                                    usage_spend_totals, usage_totals_by)

DEFAULT_DAYS = 30
# A cell starting with one of these is a formula to Excel, LibreOffice and Google Sheets
# (tab and CR too, which some strip first); model names and `user` strings are client-chosen.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """``value`` as a spreadsheet shows it and never runs: risky text gets a leading quote (OWASP)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


@staff_required
def workers_page(request):
    rows = worker_rows()
    return render(request, "console/workers.html",
                  {"rows": rows, "uncovered": models_without_worker(rows=rows), "page": "workers",
                   "metrics_interval_s": settings.PAGODA_METRICS_INTERVAL_S})


@staff_required
def workers_json(request):
    """What the workers page polls to refresh itself."""
    rows = worker_rows()
    return JsonResponse({"workers": rows, "uncovered": models_without_worker(rows=rows)})


def period_of(request) -> tuple[int, datetime]:
    try:
        days = max(1, min(3650, int(request.GET.get("days", DEFAULT_DAYS))))
    except ValueError:
        days = DEFAULT_DAYS
    today = timezone.now().date()
    since = timezone.make_aware(datetime.combine(today - timedelta(days=days - 1), time.min), dt_timezone.utc)
    return days, since


def _group(request) -> str:
    group = request.GET.get("group", "day")
    if group not in GROUPS:
        raise Http404("unknown group")
    return group


def _label(row: dict, group: str) -> str:
    if group == "key":
        return f"{row['api_key__name']} ({row['api_key__prefix']}…)" if row["api_key__prefix"] else "(deleted key)"
    value = row[GROUPS[group][0]]
    return str(value) if value not in (None, "") else "(none)"


@staff_required
def usage_page(request):
    group, (days, since) = _group(request), period_of(request)
    rows = usage_totals_by(group=group, since=since)
    for row in rows:
        row["label"] = _label(row, group)
        row["spend_text"] = format_spend(row["spend"])
    return render(request, "console/usage.html", {
        "rows": rows, "group": group, "group_label": group.replace("_", " "), "page": "usage",
        "groups": [(g, g.replace("_", " ")) for g in GROUPS], "days": days,
        "raw_only": group in RAW_ONLY_GROUPS, "total_spend": format_spend(usage_spend_totals(since=since)),
        "series": usage_daily_series(since=since), "spend_series": usage_daily_spend(since=since),
        "max_tokens": max([row["total_tokens"] or 0 for row in rows] or [0]) or 1})


@staff_required
def usage_csv(request):
    group, (days, since) = _group(request), period_of(request)
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="usage-by-{group}-{days}d.csv"'
    writer = csv.writer(response)
    rows = usage_totals_by(group=group, since=since)
    currencies = sorted({currency for row in rows for currency in row["spend"]})
    writer.writerow([group, *TOTAL_COLUMNS, *(f"spend_{currency}" for currency in currencies)])
    for row in rows:
        writer.writerow([csv_cell(_label(row, group)), *(row[column] or 0 for column in TOTAL_COLUMNS),
                         *(to_decimal(row["spend"].get(currency, 0)) for currency in currencies)])
    return response
