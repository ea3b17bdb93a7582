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


GROUPS = {  # group name -> (fields grouped by, label of the row)
    "key": ("api_key__prefix", "api_key__name"),
    "user": ("user__username",),
    "model": ("model_name",),
    "day": ("day",),
}
TOTAL_COLUMNS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_prompt_tokens",
                 "total_tokens")


def usage_totals_by(*, group: str, since=None, until=None) -> list[dict]:
    """One row per key / user / model / day (UTC) with request and token sums, largest first
    (by day: newest first). ``since`` inclusive, ``until`` exclusive (datetimes)."""
    from django.db.models import F, Q
    from django.db.models.functions import TruncDate

    if group not in GROUPS:
        raise ValueError(f"group must be one of {', '.join(GROUPS)}")
    records = UsageRecord.objects.all()
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    if group == "day":
        records = records.annotate(day=TruncDate("created_at"))
    rows = (records.values(*GROUPS[group]).order_by()
            .annotate(requests=Count("id"), errors=Count("id", filter=~Q(status=UsageRecord.Status.OK)),
                      prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
                      cached_prompt_tokens=Sum("cached_prompt_tokens"))
            .annotate(total_tokens=F("prompt_tokens") + F("completion_tokens")))
    ordering = ["-day"] if group == "day" else ["-total_tokens", "-requests"]
    return list(rows.order_by(*ordering))
