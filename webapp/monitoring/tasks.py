"""Metric snapshot jobs: Celery beat runs them (CELERY_BEAT_SCHEDULE in settings/base.py); in
embedded mode, without beat, webapp/config/embedded_jobs.py runs the beat schedule in a thread."""

from __future__ import annotations

from celery import shared_task

from webapp.monitoring.services import snapshot_purge, snapshot_take


@shared_task(name="monitoring.snapshot_workers", ignore_result=True)
def snapshot_workers() -> int:
    """One sample of every live worker; returns how many rows were stored."""
    return len(snapshot_take())


@shared_task(name="monitoring.purge_snapshots", ignore_result=True)
def purge_snapshots() -> int:
    """Delete snapshots past PAGODA_METRICS_RETENTION_HOURS; returns how many."""
    return snapshot_purge()
