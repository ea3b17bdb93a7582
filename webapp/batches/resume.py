"""After a restart of the embedded server, the batches it was running are run again from their
saved lines (done lines are kept, the others run; see runner.py)."""

from __future__ import annotations

import logging

from django.db.models import F

from webapp.batches.models import Batch
from webapp.config.after_ready import when_apps_ready

logger = logging.getLogger(__name__)


def batches_resume() -> list[int]:
    """Queue every unfinished batch again (this process being their only runner, their claims are
    void); returns their ids."""
    from webapp.batches.tasks import batch_run_task
    from webapp.config.embedded_jobs import enqueue

    ids = list(Batch.objects.filter(status__in=Batch.UNFINISHED).values_list("pk", flat=True))
    Batch.objects.filter(pk__in=ids).update(runner_id="", num_resumes=F("num_resumes") + 1)
    for batch_id in ids:
        logger.info("resuming batch %s after a restart", batch_id)
        enqueue(batch_run_task, batch_id, True)
    return ids


def resume_batches_when_ready() -> None:
    when_apps_ready(batches_resume, "resuming batches", "pagoda-batch-resume")
