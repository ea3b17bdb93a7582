"""The console's audit page (staff): the log, filtered, newest first, and as CSV. Read-only: the
log has no form that changes it."""

from __future__ import annotations

import csv
import json

from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render

from webapp.audit.selectors import CSV_COLUMNS, FILTERS, audit_choices, audit_entries
from webapp.console.access import staff_required
from webapp.console.views import csv_cell, period_of

PAGE_SIZE = 100


def _filters(request) -> dict:
    return {name: request.GET.get(name, "").strip()[:100] for name in FILTERS}


@staff_required
def audit_page(request):
    filters, (days, since) = _filters(request), period_of(request)
    page = Paginator(audit_entries(**filters, since=since), PAGE_SIZE).get_page(request.GET.get("page"))
    query = "&".join(f"{k}={v}" for k, v in filters.items() if v)
    return render(request, "console/audit.html", {"entries": page, "filters": filters, "days": days,
                                                  "choices": audit_choices(), "query": query, "page": "audit"})


@staff_required
def audit_csv(request):
    filters, (days, since) = _filters(request), period_of(request)
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="audit-{days}d.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for entry in audit_entries(**filters, since=since).iterator():
        row = []
        for column in CSV_COLUMNS:
            value = getattr(entry, column)
            row.append(csv_cell(json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else
                                value.isoformat() if column == "at" else "" if value is None else value))
        writer.writerow(row)
    return response
