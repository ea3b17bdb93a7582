"""Reads of usage: raw records, and daily roll-ups for the days whose raw records were purged.

A ``running`` record (its request not ended yet) is in no total but its own column: its request,
its tokens and its outcome count once it ends, as the roll-ups and the budgets count them.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone as dt_timezone

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate

from webapp.usage.models import UsageDaily, UsageRecord


def usage_list(*, api_key=None, model=None) -> QuerySet[UsageRecord]:
    records = UsageRecord.objects.all()
    if api_key is not None:
        records = records.filter(api_key=api_key)
    if model is not None:
        records = records.filter(model=model)
    return records


RUNNING = Q(status=UsageRecord.Status.RUNNING)
ENDED = ~RUNNING


def _sums() -> dict:
    """The totals of a group of raw records: ended requests, errors (every end but ok), their
    tokens; and the requests still running."""
    return dict(requests=Count("id", filter=ENDED), errors=Count("id", filter=ENDED & ~Q(status=UsageRecord.Status.OK)),
                prompt_tokens=Sum("prompt_tokens", filter=ENDED), completion_tokens=Sum("completion_tokens", filter=ENDED),
                cached_prompt_tokens=Sum("cached_prompt_tokens", filter=ENDED), running=Count("id", filter=RUNNING),
                cost_nanos=Sum("cost_nanos", filter=ENDED))


def usage_totals(*, api_key=None, model=None) -> dict:
    """Requests and token sums over the records selected as in usage_list (ended ones), and how many run."""
    totals = usage_list(api_key=api_key, model=model).aggregate(**_sums())
    return {key: value or 0 for key, value in totals.items() if key not in ("errors", "cost_nanos")}


GROUPS = {  # group name -> (fields grouped by, label of the row)
    "key": ("api_key__prefix", "api_key__name"),
    "user": ("user__username",),
    "model": ("model_name",),
    "organisation": ("organisation_name",),  # a team key's, kept when the team or organisation goes
    "team": ("team_name",),
    "day": ("day",),
    "end_user": ("end_user",),  # the API's ``user`` parameter (UsageRecord.end_user)
}
# UsageDaily has no end_user: grouped by end user, purged days are left out (raw records only).
RAW_ONLY_GROUPS = frozenset({"end_user"})
TOTAL_COLUMNS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_prompt_tokens",
                 "total_tokens", "running")


# Where each grouped-by field comes from: raw records (annotated in _raw) and daily roll-ups. A
# model is its registry slug, else the name asked for, as usage_rollup_day stores it, so a row
# does not change name when its day's raw records are purged.
_RAW_FIELD = {"api_key__prefix": "api_key__prefix", "api_key__name": "api_key__name",
              "user__username": "user__username", "model_name": "slug", "day": "day", "end_user": "end_user",
              "team_name": "team_name", "organisation_name": "organisation_name", "currency": "currency"}
_DAILY_FIELD = {**{f: v for f, v in _RAW_FIELD.items() if f != "end_user"}, "model_name": "model_slug"}
_SUMMED_DAILY = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "cost_nanos")
_SUMMED = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_prompt_tokens",
           "running")  # the roll-ups have ended requests only


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=dt_timezone.utc)


def _first_day_from(moment: datetime) -> date:
    """The first UTC day starting at or after ``moment``."""
    day = moment.astimezone(dt_timezone.utc).date()
    return day if _day_start(day) >= moment else day + timedelta(days=1)


def _raw(fields: tuple[str, ...], since, until, scope: Q | None = None) -> list[dict]:
    records = UsageRecord.objects.all() if scope is None else UsageRecord.objects.filter(scope)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    records = records.annotate(day=TruncDate("created_at", tzinfo=dt_timezone.utc),
                               slug=Coalesce("model__slug", "model_name"))
    return list(records.values(*(_RAW_FIELD[f] for f in fields)).order_by().annotate(**_sums()))


def _rolled_up(fields: tuple[str, ...], since, until) -> list[dict]:
    """UsageDaily sums for the days in range that have no raw records left (purged). A day is in
    range when its start (00:00 UTC) is in [since, until): a purged day cannot be split."""
    daily = UsageDaily.objects.all()
    if since is not None:
        daily = daily.filter(day__gte=_first_day_from(since))
    if until is not None:
        daily = daily.filter(day__lt=_first_day_from(until))
    days = set(daily.values_list("day", flat=True).distinct())
    if not days:
        return []
    with_raw = set(UsageRecord.objects.filter(created_at__gte=_day_start(min(days)),
                                              created_at__lt=_day_start(max(days) + timedelta(days=1)))
                   .annotate(day=TruncDate("created_at", tzinfo=dt_timezone.utc))
                   .values_list("day", flat=True).distinct())
    return list(daily.exclude(day__in=with_raw).values(*(_DAILY_FIELD[f] for f in fields)).order_by()
                .annotate(**{column: Sum(column) for column in _SUMMED_DAILY}))


def _totals(fields: tuple[str, ...], since, until, scope: Q | None = None) -> list[dict]:
    """Sums per ``fields`` over raw records and, for purged days, their daily roll-ups (unless a
    field is one the roll-ups do not keep, such as end_user, or the records are narrowed to a
    ``scope``: then raw records only). ``spend``: the cost per currency, in nano-units (an
    unpriced model's requests cost nothing, in no currency)."""
    merged: dict[tuple, dict] = {}
    rolled_up = _rolled_up((*fields, "currency"), since, until) \
        if scope is None and all(f in _DAILY_FIELD for f in fields) else []
    for rows, source in ((_raw((*fields, "currency"), since, until, scope), _RAW_FIELD), (rolled_up, _DAILY_FIELD)):
        for row in rows:
            key = tuple(row[source[f]] for f in fields)
            total = merged.setdefault(key, {**dict(zip(fields, key)), **dict.fromkeys(_SUMMED, 0), "spend": {}})
            for column in _SUMMED:
                total[column] += row.get(column) or 0
            if row.get("cost_nanos") and row["currency"]:
                total["spend"][row["currency"]] = total["spend"].get(row["currency"], 0) + row["cost_nanos"]
    for total in merged.values():
        total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return list(merged.values())


def usage_totals_by(*, group: str, since=None, until=None) -> list[dict]:
    """One row per key / user / model / day (UTC) / end user with request and token sums, largest
    first (by day: newest first). ``since`` inclusive, ``until`` exclusive (datetimes). Days whose
    raw records were purged count through their UsageDaily roll-ups, so totals survive retention;
    except by end user (RAW_ONLY_GROUPS), which the roll-ups do not keep: raw records only."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {', '.join(GROUPS)}")
    rows = _totals(GROUPS[group], since, until)
    if group == "day":
        return sorted(rows, key=lambda row: row["day"], reverse=True)
    return sorted(rows, key=lambda row: (-row["total_tokens"], -row["requests"],
                                         tuple(str(row[f]) for f in GROUPS[group])))


def usage_daily_series(*, since: datetime, until: datetime | None = None) -> dict:
    """Tokens per UTC day and model for the usage chart: ``{"days": [ISO dates, oldest first, every
    day from since's to until's (default today)], "models": {model: [total tokens per day]}}``."""
    first = since.astimezone(dt_timezone.utc).date()
    last = (until - timedelta(microseconds=1)).astimezone(dt_timezone.utc).date() if until else \
        datetime.now(dt_timezone.utc).date()
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    index = {day: n for n, day in enumerate(days)}
    models: dict[str, list[int]] = {}
    for row in _totals(("day", "model_name"), since, until):
        if row["day"] in index:
            models.setdefault(row["model_name"] or "(none)", [0] * len(days))[index[row["day"]]] += row["total_tokens"]
    return {"days": [day.isoformat() for day in days], "models": dict(sorted(models.items()))}


def usage_scoped_totals_by(*, group: str, scope: Q, since=None) -> list[dict]:
    """usage_totals_by over the raw records in ``scope`` only (a member's or a key's own: the days
    within the retention period)."""
    rows = _totals(GROUPS[group], since, None, scope)
    return sorted(rows, key=lambda row: (-row["total_tokens"], tuple(str(row[f]) for f in GROUPS[group])))


def usage_spend_totals(*, since=None, until=None, scope: Q | None = None) -> dict[str, int]:
    """The whole period's spend per currency (nano-units), from the same sums as every group's."""
    spend: dict[str, int] = {}
    for row in _totals((), since, until, scope):
        for currency, nanos in row["spend"].items():
            spend[currency] = spend.get(currency, 0) + nanos
    return spend


def usage_daily_spend(*, since: datetime, until: datetime | None = None) -> dict:
    """Spend per UTC day and currency for the spend chart, in the shape of usage_daily_series
    (``"models"`` keyed by currency, amounts as floats for drawing only)."""
    series = usage_daily_series(since=since, until=until)
    index = {day: n for n, day in enumerate(series["days"])}
    currencies: dict[str, list[float]] = {}
    for row in _totals(("day",), since, until):
        for currency, nanos in row["spend"].items():
            if row["day"].isoformat() in index:
                currencies.setdefault(currency, [0.0] * len(index))[index[row["day"].isoformat()]] += nanos / 1e9
    return {"days": series["days"], "models": dict(sorted(currencies.items()))}
