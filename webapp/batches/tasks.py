"""The batch job: queued by services.batch_create (and resume.py), in-process in embedded mode."""

from __future__ import annotations

from celery import shared_task

from webapp.batches.runner import batch_run


# acks_late: a Celery worker that dies mid-batch leaves the task queued again, and the next run
# takes the batch over once its runner's heartbeat is stale.
@shared_task(name="batches.run", acks_late=True, reject_on_worker_lost=True)
def batch_run_task(batch_id: int, force: bool = False) -> str:
    return batch_run(batch_id=batch_id, force=force)
