"""Metric snapshots: the live workers' headline figures, sampled periodically for the console's charts."""

from django.db import models


class WorkerSnapshot(models.Model):
    """One worker at one sample. Every row of a sample shares ``taken_at``, so rows of the same
    model and instant add up to the model's figures (webapp/monitoring/selectors.py). Rows older
    than PAGODA_METRICS_RETENTION_HOURS are purged."""

    taken_at = models.DateTimeField(db_index=True)
    model_slug = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    worker_id = models.CharField(max_length=200)
    num_running = models.PositiveIntegerField(default=0)
    num_waiting = models.PositiveIntegerField(default=0)
    kv_cache_usage = models.FloatField(default=0.0)  # 0..1
    tokens_per_s = models.FloatField(default=0.0)
    ttft_p50 = models.FloatField(null=True, blank=True)  # seconds; None before the first request
    ttft_p95 = models.FloatField(null=True, blank=True)
    itl_p50 = models.FloatField(null=True, blank=True)
    itl_p95 = models.FloatField(null=True, blank=True)
    prefix_cache_hit_rate = models.FloatField(null=True, blank=True)  # 0..1; None before any lookup

    class Meta:
        ordering = ["taken_at", "model_slug", "worker_id"]
        indexes = [models.Index(fields=["model_slug", "taken_at"])]

    def __str__(self) -> str:
        return f"{self.taken_at:%Y-%m-%d %H:%M:%S} {self.model_slug} {self.worker_id}"
