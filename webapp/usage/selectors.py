"""Reads of usage records."""

from __future__ import annotations

from django.db.models import Count, QuerySet, Sum

from webapp.usage.models import UsageRecord


def usage_list(*, api_key=None, model=None) -> QuerySet[UsageRecord]:
    records = UsageRecord.objects.all()
    if api_key is not None:
        records = records.filter(api_key=api_key)
    if model is not None:
        records = records.filter(model=model)
    return records


def usage_totals(*, api_key=None, model=None) -> dict:
    """Requests and token sums over the records selected as in usage_list."""
    totals = usage_list(api_key=api_key, model=model).aggregate(
        requests=Count("id"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
        cached_prompt_tokens=Sum("cached_prompt_tokens"))
    return {key: value or 0 for key, value in totals.items()}
