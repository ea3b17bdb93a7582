"""Writes of usage records (one per request, however it ended), their daily roll-ups and their purge."""

from __future__ import annotations

import logging

from datetime import date, datetime, time, timedelta, timezone as dt_timezone
from time import monotonic

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from webapp.billing.pricing import record_charge
from webapp.keys.enforcement import limits_release
from webapp.keys.limits import get_limit_store
from webapp.monitoring.metrics import observe_api_request
from webapp.registry.models import Model, ModelVersion
from webapp.registry.selectors import modelversion_served
from webapp.usage.models import UsageDaily, UsageRecord
from webapp.usage.outcome import Outcome

logger = logging.getLogger(__name__)


def usage_record_create(**fields) -> UsageRecord:
    """Write one usage record (``usage_record_build``'s fields)."""
    record = usage_record_build(**fields)
    record.save()
    return record


def usage_record_build(*, request_id: str, endpoint: str, status: str, latency: float, api_key=None,
                       user=None, model=None, version=None, model_name: str = "", prompt_tokens: int = 0,
                       completion_tokens: int = 0, cached_prompt_tokens: int = 0,
                       time_to_first_token: float | None = None, finish_reason: str | None = None,
                       error_code: str | None = None, end_user: str = "", process_id: str = "") -> UsageRecord:
    """A validated usage record, not yet saved (webapp.usage.group_commit saves many at once)."""
    team = api_key.team if api_key is not None and api_key.team_id is not None else None
    record = UsageRecord(
        api_key=api_key, user=user, model=model, version=version, model_name=model_name, end_user=end_user,
        team=team, team_name=team.name if team else "", organisation=team.organisation if team else None,
        organisation_name=team.organisation.name if team else "",
        request_id=request_id, endpoint=endpoint, prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens, cached_prompt_tokens=cached_prompt_tokens,
        time_to_first_token=time_to_first_token, latency=latency, status=status,
        finish_reason=finish_reason or "", error_code=error_code or "", process_id=process_id)
    record.full_clean(exclude=["api_key", "user", "model", "version", "team", "organisation", "price"])  # just loaded
    return record


def usage_record_start(*, request_id: str, endpoint: str, started: float, model: Model, version: ModelVersion,
                       num_prompt_tokens: int, api_key=None, user=None, end_user: str = "",
                       model_name: str | None = None) -> UsageRecord:
    """The ``running`` record of a request about to be sent to a worker (API request, batch line or
    chat turn), naming this process with its lease renewed (LimitStoreUnavailable if it cannot be),
    so that the request is accounted for even if this process dies before it ends. ``model_name``:
    what the request ran as when not the model's slug (a LoRA adapter's ``base:adapter``)."""
    return usage_record_create(
        request_id=request_id, endpoint=endpoint, status=UsageRecord.Status.RUNNING, latency=monotonic() - started,
        api_key=api_key, user=user, model=model, version=version, model_name=model_name or model.slug,
        prompt_tokens=num_prompt_tokens, end_user=end_user, process_id=get_limit_store().lease())


def usage_status(*, outcome: Outcome, aborted: bool = False, error_code: str | None = None) -> str:
    """How a generation ended: aborted (the client left, or the engine says so of any of its
    choices), error, or ok."""
    if aborted or any(choice.finish_reason == "abort" for choice in outcome.choices):
        return UsageRecord.Status.ABORTED
    if error_code is not None or outcome.error is not None or not outcome.finished:
        return UsageRecord.Status.ERROR
    return UsageRecord.Status.OK


def _charge(fields: dict, model_id: int | None, at) -> dict:
    """The record's cost fields for its final counts, at the price in force at ``at`` (its start)."""
    return record_charge(model_id=model_id, at=at, prompt_tokens=fields["prompt_tokens"],
                         cached_prompt_tokens=fields.get("cached_prompt_tokens") or 0,
                         completion_tokens=fields["completion_tokens"])


def usage_record_close(*, request_id: str, fields: dict, subject=None, record: dict | None = None) -> bool:
    """End a request's ``running`` record with ``fields`` and its cost (webapp.billing, computed
    here once) and charge its tokens and cost to ``subject`` (an ApiKey or ChatLimits: its slot
    freed, its reservations settled), in one transaction; False, and nothing charged, when the
    record has ended already (whoever ends it charges it, once).
    Without a running record (one started before this version of Pagoda ran), ``record`` holds
    the rest of usage_record_build's fields and a finished one is written."""
    with transaction.atomic():
        running = UsageRecord.objects.filter(request_id=request_id, status=UsageRecord.Status.RUNNING)
        started = running.values("model_id", "created_at").first()
        charge = _charge(fields, started["model_id"], started["created_at"]) if started else None
        closed = started is not None and running.update(**fields, **charge, process_id="")
        if not closed:
            if record is None or UsageRecord.objects.filter(request_id=request_id).exists():
                return False
            model = record.get("model")
            charge = _charge(fields, model.pk if model else None, timezone.now())
            usage_record_create(request_id=request_id, **record, **fields)
            UsageRecord.objects.filter(request_id=request_id).update(**charge)
        if subject is not None:
            limits_release(subject=subject, request_id=request_id,
                           tokens=fields["prompt_tokens"] + fields["completion_tokens"],
                           cost_nanos=charge["cost_nanos"], currency=charge["currency"])
    created = UsageRecord.objects.filter(request_id=request_id).values_list("created_at", flat=True).first()
    if created is not None and created < _day_bounds(timezone.now().date())[0]:
        usage_rollup_day(day=created.date())  # it began before midnight (UTC): its day's roll-up changed
    return True


def usage_record_finish(*, request_id: str, endpoint: str, started: float, outcome: Outcome, model: Model,
                        version: ModelVersion, num_prompt_tokens: int, api_key=None, user=None, limits=None,
                        end_user: str = "", aborted: bool = False, error_code: str | None = None) -> UsageRecord:
    """Account for a generation that reached a worker, however it ended (API request or chat turn):
    its running record (usage_record_start) completed.

    Token counts are the engine's; ``num_prompt_tokens`` (the prompt as tokenized here) stands in
    when no chunk arrived and nothing failed. ``version`` is the version admitted: the record names
    the one that answered. ``error_code`` is a failure seen on the web side (the outcome's own error
    counts too). The tokens are charged to ``limits`` (a chat user's ChatLimits), else to the
    ``api_key``, whose concurrency slot is freed. A record the reconciler closed meanwhile (this
    process was taken for dead) stays as it is, charged once.
    """
    error_code = error_code or (outcome.error.code if outcome.error is not None else None)
    status = usage_status(outcome=outcome, aborted=aborted, error_code=error_code)
    latency = monotonic() - started
    prompt_tokens = outcome.num_prompt_tokens
    if prompt_tokens is None:  # no chunk arrived: the engine never counted it
        prompt_tokens = 0 if error_code else num_prompt_tokens
    fields = dict(status=status, latency=latency, prompt_tokens=prompt_tokens,
                  completion_tokens=outcome.num_output_tokens, cached_prompt_tokens=outcome.num_cached_tokens,
                  time_to_first_token=outcome.time_to_first_token,
                  version=modelversion_served(admitted=version, served_label=outcome.served_version),
                  finish_reason=(outcome.finish_reason if outcome.finished else None) or "",
                  error_code=error_code or "")
    if not usage_record_close(request_id=request_id, fields=fields, subject=limits or api_key, record=dict(
            endpoint=endpoint, api_key=api_key, user=user, model=model, model_name=model.slug, end_user=end_user)):
        logger.warning("request %s ended after its usage record was closed (its process was taken for dead); "
                       "the record stays as it was", request_id, extra={"request_id": request_id})
    observe_api_request(model=model.slug, endpoint=endpoint, status=status, latency=latency,
                        time_to_first_token=outcome.time_to_first_token, error_code=error_code)
    # The id the client got in X-Request-Id, the worker logged its lines with, and the record holds.
    logger.info("request %s %s (%s): %s%s, %d + %d tokens in %.3f s", request_id, endpoint, model.slug, status,
                f" {error_code}" if error_code else "", prompt_tokens, outcome.num_output_tokens, latency,
                extra={"request_id": request_id})
    return UsageRecord.objects.filter(request_id=request_id).first()


# Roll-ups and retention: raw records become one UsageDaily row per day, key, user and model, and
# raw records older than PAGODA_USAGE_RETENTION_DAYS are deleted once their day is rolled up.

def _day_bounds(day: date) -> tuple[datetime, datetime]:
    """[start, end) of a UTC calendar day."""
    start = datetime.combine(day, time.min, tzinfo=dt_timezone.utc)
    return start, start + timedelta(days=1)


@transaction.atomic
def usage_rollup_day(*, day: date) -> list[UsageDaily]:
    """Recompute ``day``'s UsageDaily rows from its ended raw records (delete, then insert); running
    it again gives the same rows. A day whose raw records were already purged is left as it is."""
    start, end = _day_bounds(day)
    # Running records count once they end (usage_record_close rolls their day up again then).
    records = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end).exclude(
        status=UsageRecord.Status.RUNNING)
    if not records.exists():
        return list(UsageDaily.objects.filter(day=day))
    groups = (records.annotate(slug=Coalesce("model__slug", "model_name"))
              .values("api_key", "user", "slug", "team_name", "organisation_name", "currency")
              .order_by()
              .annotate(requests=Count("id"), errors=Count("id", filter=~Q(status=UsageRecord.Status.OK)),
                        prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
                        cached_prompt_tokens=Sum("cached_prompt_tokens"), cost_nanos=Sum("cost_nanos")))
    UsageDaily.objects.filter(day=day).delete()
    return UsageDaily.objects.bulk_create([
        UsageDaily(day=day, api_key_id=g["api_key"], user_id=g["user"], model_slug=g["slug"] or "",
                   team_name=g["team_name"], organisation_name=g["organisation_name"], currency=g["currency"],
                   requests=g["requests"], errors=g["errors"], prompt_tokens=g["prompt_tokens"],
                   completion_tokens=g["completion_tokens"], cached_prompt_tokens=g["cached_prompt_tokens"],
                   cost_nanos=g["cost_nanos"] or 0)
        for g in groups])


@transaction.atomic
def usage_purge(*, older_than_days: int | None = None, today: date | None = None) -> int:
    """Delete raw records from days before ``today - older_than_days`` (default: the
    PAGODA_USAGE_RETENTION_DAYS setting) whose day is rolled up, i.e. whose UsageDaily rows count
    exactly that day's records (a day with a running record never is); other days are kept.
    Returns how many records were deleted."""
    if older_than_days is None:
        older_than_days = settings.PAGODA_USAGE_RETENTION_DAYS
    if not isinstance(older_than_days, int) or older_than_days < 1:
        raise ValidationError("older_than_days must be a positive integer", code="invalid_retention")
    cutoff, _ = _day_bounds((today or timezone.now().date()) - timedelta(days=older_than_days))
    old = UsageRecord.objects.filter(created_at__lt=cutoff)
    raw_counts = dict(old.annotate(day=TruncDate("created_at")).values("day").order_by()
                      .annotate(n=Count("id")).values_list("day", "n"))
    rolled_counts = dict(UsageDaily.objects.filter(day__in=list(raw_counts)).values("day").order_by()
                         .annotate(n=Sum("requests")).values_list("day", "n"))
    deleted = 0
    for day, count in raw_counts.items():
        if rolled_counts.get(day) == count:
            start, end = _day_bounds(day)
            deleted += old.filter(created_at__gte=start, created_at__lt=end).delete()[0]
    return deleted
