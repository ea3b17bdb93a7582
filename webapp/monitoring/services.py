"""Writes of metric snapshots: take one from the live workers, purge the old ones."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from webapp.monitoring.figures import worker_figures
from webapp.monitoring.models import WorkerSnapshot
from workers.connect import get_engine_client

SNAPSHOT_FIELDS = ("num_running", "num_waiting", "kv_cache_usage", "tokens_per_s", "ttft_p50", "ttft_p95",
                   "itl_p50", "itl_p95", "prefix_cache_hit_rate")


def snapshot_take(*, now: datetime | None = None) -> list[WorkerSnapshot]:
    """Store one row per live worker, all stamped ``now``; returns them (none without workers).

    The workers' heartbeats are in Redis (or in this process, embedded), so the sample is read
    here; no worker has to run a job for it."""
    taken_at = now or timezone.now()
    rows = []
    for info in get_engine_client(settings.REDIS_URL).live_workers():
        figures = worker_figures(info.stats)
        rows.append(WorkerSnapshot(taken_at=taken_at, model_slug=info.model, version=info.version,
                                   worker_id=info.worker_id, **{f: figures[f] for f in SNAPSHOT_FIELDS}))
    return WorkerSnapshot.objects.bulk_create(rows)


def snapshot_purge(*, older_than_hours: int | None = None, now: datetime | None = None) -> int:
    """Delete snapshots taken before ``now - older_than_hours`` (default: the
    PAGODA_METRICS_RETENTION_HOURS setting); returns how many."""
    if older_than_hours is None:
        older_than_hours = settings.PAGODA_METRICS_RETENTION_HOURS
    if not isinstance(older_than_hours, int) or isinstance(older_than_hours, bool) or older_than_hours < 1:
        raise ValidationError("older_than_hours must be a positive integer", code="invalid_retention")
    cutoff = (now or timezone.now()) - timedelta(hours=older_than_hours)
    return WorkerSnapshot.objects.filter(taken_at__lt=cutoff).delete()[0]
