"""Background jobs on the workers' side, registered by name."""

from __future__ import annotations

from celery import shared_task

from workers.transport import get_engine_client


@shared_task(name="workers.snapshot_worker_metrics")
def snapshot_worker_metrics(model: str | None = None) -> list[dict]:
    """The live workers (of ``model``, or all) with their metrics, as JSON-ready dicts.

    For callers that can only queue a task by name (``WorkerInfo.to_dict()`` each; ``stats`` is
    described in workers/metrics.py). The console's stored time series come from the webapp's
    monitoring.snapshot_workers, which reads the same heartbeats in its own process.
    """
    return [info.to_dict() for info in get_engine_client().live_workers(model)]
