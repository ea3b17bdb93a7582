"""After a restart of the embedded server, the batches it was running are run again from their
saved lines (done lines are kept, the others run; see runner.py)."""

from __future__ import annotations

import logging
import threading
import time

from django.apps import apps
from django.db import connection
from django.db.models import F

from webapp.batches.models import Batch

logger = logging.getLogger(__name__)
APPS_READY_TIMEOUT_S = 60.0


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


def _resume_after_setup() -> None:
    deadline = time.monotonic() + APPS_READY_TIMEOUT_S
    while not apps.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        batches_resume()
    except Exception:
        logger.exception("resuming batches failed")
    finally:
        connection.close()


def resume_batches_when_ready() -> None:
    threading.Thread(target=_resume_after_setup, name="pagoda-batch-resume", daemon=True).start()
