"""Background jobs in embedded mode, where no Celery worker or beat runs.

Without REDIS_URL, Celery is eager: ``task.delay()`` would run the job inside the request that
queued it (an upload's validation would hold the upload's request for its whole run, so the
uploader never sees the progress bar move), and nothing would run CELERY_BEAT_SCHEDULE at all.
The embedded server (``make run``: PAGODA_EMBEDDED_WORKERS=1, no REDIS_URL) therefore:

- ``enqueue(task, *args)``: runs queued jobs in a daemon thread of the server process;
- ``start_embedded_beat()``: runs the beat schedule itself in one daemon thread, reading the
  same Celery schedule objects (intervals and crontabs) that ``celery beat`` would.

Anywhere else (tests, management commands) an eager ``enqueue`` runs in the caller as before,
and with Redis it is an ordinary ``delay()``. Every job run here closes its thread's database
connection afterwards, as a request would.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from django.apps import apps
from django.conf import settings
from django.db import connection

from webapp.config.after_ready import APPS_READY_TIMEOUT_S

logger = logging.getLogger(__name__)

EMBEDDED_WORKERS_FLAG = "PAGODA_EMBEDDED_WORKERS"

MAX_SLEEP_S = 60.0  # re-read the clock at least this often (crontabs across clock changes)


def embedded_server() -> bool:
    """This process is the embedded server: it runs engine workers and background jobs itself."""
    return os.environ.get(EMBEDDED_WORKERS_FLAG) == "1" and not os.environ.get("REDIS_URL")


def _celery_app():
    from webapp.config.celery import app

    app.loader.import_default_modules()  # every app's tasks.py, so tasks resolve by name
    return app


def _run_job(task, args: tuple, kwargs: dict) -> None:
    try:
        task.apply(args=args, kwargs=kwargs, throw=True)
    except Exception:
        logger.exception("background job %s%r failed", task.name, args)
    finally:
        connection.close()


def enqueue(task, *args, **kwargs) -> None:
    """Queue ``task``: Celery with Redis; a server thread in embedded mode; the caller otherwise."""
    if not _celery_app().conf.task_always_eager:
        task.delay(*args, **kwargs)
    elif embedded_server():
        threading.Thread(target=_run_job, args=(task, args, kwargs), name=f"pagoda-job-{task.name}",
                         daemon=True).start()
    else:
        task.apply(args=args, kwargs=kwargs, throw=True)


@dataclass
class _Entry:
    name: str
    task: object
    schedule: object  # celery.schedules.schedule / crontab
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    last_run_at: object = None


def _entries(app, beat_schedule: dict) -> list[_Entry]:
    from celery.schedules import maybe_schedule

    entries = []
    now = app.now()
    for name, spec in beat_schedule.items():
        task = app.tasks.get(spec["task"])
        if task is None:
            raise LookupError(f"beat entry {name!r} names an unknown task {spec['task']!r}")
        entries.append(_Entry(name, task, maybe_schedule(spec["schedule"], app=app),
                              tuple(spec.get("args", ())), dict(spec.get("kwargs", {})), last_run_at=now))
    return entries


def _beat(beat_schedule: dict | None, stop: threading.Event) -> None:
    waited = 0.0
    while not apps.ready and waited < APPS_READY_TIMEOUT_S:
        stop.wait(0.05)
        waited += 0.05
    app = _celery_app()
    entries = _entries(app, settings.CELERY_BEAT_SCHEDULE if beat_schedule is None else beat_schedule)
    logger.info("embedded beat runs %s", ", ".join(e.name for e in entries) or "nothing")
    while not stop.is_set():
        sleep_s = MAX_SLEEP_S
        for entry in entries:
            due, next_s = entry.schedule.is_due(entry.last_run_at)
            if due:
                entry.last_run_at = app.now()
                _run_job(entry.task, entry.args, entry.kwargs)
                due, next_s = entry.schedule.is_due(entry.last_run_at)
            sleep_s = min(sleep_s, next_s)
        stop.wait(max(0.01, sleep_s))


_lock = threading.Lock()
_beat_thread: tuple[threading.Thread, threading.Event] | None = None


def start_embedded_beat(beat_schedule: dict | None = None) -> threading.Event:
    """Run ``beat_schedule`` (default: CELERY_BEAT_SCHEDULE) in a daemon thread, once per process.

    Entries first run one period after the start (as ``celery beat`` does); set the returned
    event, or call stop_embedded_beat(), to stop it.
    """
    global _beat_thread
    with _lock:
        if _beat_thread is not None and _beat_thread[0].is_alive() and not _beat_thread[1].is_set():
            return _beat_thread[1]
        stop = threading.Event()
        thread = threading.Thread(target=_beat, args=(beat_schedule, stop), name="pagoda-embedded-beat",
                                  daemon=True)
        thread.start()
        _beat_thread = (thread, stop)
        return stop


def stop_embedded_beat(timeout: float = 10.0) -> None:
    """Stop the beat thread and wait for a job it is running (tests, shutdown)."""
    with _lock:
        running = _beat_thread
    if running is not None:
        running[1].set()
        running[0].join(timeout)
