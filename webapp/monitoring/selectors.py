"""Reads of metric snapshots: per-model time series for the console's charts.

Two steps. The database sums each sample (one ``taken_at``) over a model's workers: tokens/s,
running and waiting add up; KV cache use gives the mean and the max over the workers; latency
percentiles, which do not add, give the mean of the workers' p50s and the max of their p95s.
Then samples fall into buckets of WINDOWS[window] seconds (aligned to the epoch), and each
bucket takes the mean over its samples, except the maxima (kv_max, ttft_p95, itl_p95), which
take the max. A window of a day thus gives at most 1440 points, whatever the sampling interval.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Avg, Max, Sum
from django.utils import timezone

from webapp.monitoring.models import WorkerSnapshot

WINDOWS = {"1h": (timedelta(hours=1), 10), "1d": (timedelta(days=1), 60)}  # window -> (span, bucket s)
MEAN_FIELDS = ("tokens_per_s", "num_running", "num_waiting", "kv_mean", "ttft_p50", "itl_p50")
MAX_FIELDS = ("kv_max", "ttft_p95", "itl_p95")
SERIES_FIELDS = ("tokens_per_s", "num_running", "num_waiting", "kv_mean", "kv_max", "ttft_p50", "ttft_p95",
                 "itl_p50", "itl_p95")


def snapshot_models(*, since: datetime | None = None) -> list[str]:
    """The model slugs with snapshots (since ``since``), sorted."""
    rows = WorkerSnapshot.objects.all()
    if since is not None:
        rows = rows.filter(taken_at__gte=since)
    return sorted(set(rows.values_list("model_slug", flat=True)))


def _per_sample(*, since: datetime, until: datetime, model: str | None):
    rows = WorkerSnapshot.objects.filter(taken_at__gte=since, taken_at__lt=until)
    if model is not None:
        rows = rows.filter(model_slug=model)
    return (rows.values("model_slug", "taken_at").order_by("model_slug", "taken_at")
            .annotate(tokens_per_s=Sum("tokens_per_s"), num_running=Sum("num_running"),
                      num_waiting=Sum("num_waiting"), kv_mean=Avg("kv_cache_usage"), kv_max=Max("kv_cache_usage"),
                      ttft_p50=Avg("ttft_p50"), ttft_p95=Max("ttft_p95"), itl_p50=Avg("itl_p50"),
                      itl_p95=Max("itl_p95")))


def _reduce(samples: list[dict]) -> dict:
    point = {}
    for field in SERIES_FIELDS:
        values = [s[field] for s in samples if s[field] is not None]
        if not values:
            point[field] = None
        elif field in MAX_FIELDS:
            point[field] = max(values)
        else:
            point[field] = sum(values) / len(values)
    return point


def metric_series(*, window: str, model: str | None = None, now: datetime | None = None) -> dict:
    """``{"window", "bucket_s", "since", "until", "model_slugs": [every model sampled in the window],
    "models": {slug (only ``model`` if given): {"t": [bucket starts, epoch s],
    field: [one value or None per t], ...}}}`` over the last ``window`` ("1h" or "1d")."""
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    span, bucket_s = WINDOWS[window]
    until = now or timezone.now()
    since = until - span
    buckets: dict[str, dict[int, list[dict]]] = {}
    for sample in _per_sample(since=since, until=until, model=model):
        start = int(sample["taken_at"].timestamp() // bucket_s * bucket_s)
        buckets.setdefault(sample["model_slug"], {}).setdefault(start, []).append(sample)
    models = {}
    for slug, by_start in sorted(buckets.items()):
        starts = sorted(by_start)
        points = [_reduce(by_start[start]) for start in starts]
        models[slug] = {"t": starts, **{field: [p[field] for p in points] for field in SERIES_FIELDS}}
    return {"window": window, "bucket_s": bucket_s, "since": since.timestamp(), "until": until.timestamp(),
            "model_slugs": snapshot_models(since=since), "models": models}
