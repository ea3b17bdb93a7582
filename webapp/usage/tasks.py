"""Usage jobs, scheduled by CELERY_BEAT_SCHEDULE in settings/base.py: the daily roll-up and purge, and
the reconciler of records whose web process died (every PAGODA_USAGE_RECONCILE_INTERVAL_S)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from webapp.usage.reconcile import usage_reconcile
from webapp.usage.services import usage_purge, usage_rollup_day


@shared_task(name="usage.rollup_yesterday")
def usage_rollup_yesterday() -> int:
    """Roll up yesterday (UTC); returns the number of daily rows written."""
    return len(usage_rollup_day(day=timezone.now().date() - timedelta(days=1)))


@shared_task(name="usage.purge_expired")
def usage_purge_expired() -> int:
    """Delete rolled-up raw records past the retention; returns how many."""
    return usage_purge(older_than_days=settings.PAGODA_USAGE_RETENTION_DAYS)


@shared_task(name="usage.reconcile")
def usage_reconcile_lost() -> int:
    """End the running records of dead web processes; returns how many."""
    return usage_reconcile()
