"""Background jobs on the workers' side, registered by name."""

from __future__ import annotations

from celery import shared_task

from workers.transport import get_engine_client


@shared_task(name="workers.snapshot_worker_metrics")
def snapshot_worker_metrics(model: str | None = None) -> list[dict]:
    """The live workers (of ``model``, or all) with their metrics, as JSON-ready dicts.

    One sample of the time series behind the console's charts: run it periodically (Celery
    beat) and store the result. Each dict is ``WorkerInfo.to_dict()``; ``stats`` is described
    in workers/metrics.py.
    """
    return [info.to_dict() for info in get_engine_client().live_workers(model)]
