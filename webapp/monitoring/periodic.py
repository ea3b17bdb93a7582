"""Embedded mode's stand-in for Celery beat: a daemon thread that runs the metric snapshot job
every PAGODA_METRICS_INTERVAL_S seconds (and the purge about hourly) in the server process.

Without REDIS_URL, Celery is eager and no beat runs, so nothing else would ever sample the
workers. Started next to the embedded workers (webapp/registry/embedded.py); tests start it
themselves. Each run closes the thread's database connection, as a request would.
"""

from __future__ import annotations

import logging
import threading
import time

from django.apps import apps
from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

PURGE_EVERY_S = 3600.0
APPS_READY_TIMEOUT_S = 60.0

_lock = threading.Lock()
_runner: tuple[threading.Thread, threading.Event] | None = None


def _run(interval_s: float, stop: threading.Event) -> None:
    from webapp.monitoring.tasks import purge_snapshots, snapshot_workers

    deadline = time.monotonic() + APPS_READY_TIMEOUT_S
    while not apps.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    next_purge = time.monotonic()
    while not stop.wait(interval_s):
        try:
            snapshot_workers()
            if time.monotonic() >= next_purge:
                purge_snapshots()
                next_purge = time.monotonic() + PURGE_EVERY_S
        except Exception:  # a failed sample (database busy, ...) must not end the series
            logger.exception("metric snapshot failed")
        finally:
            connection.close()


def start_snapshot_runner(*, interval_s: float | None = None) -> threading.Event:
    """Start the runner once per process (later calls return the running one's stop event);
    set the returned event to stop it."""
    global _runner
    interval_s = settings.PAGODA_METRICS_INTERVAL_S if interval_s is None else interval_s
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s!r}")
    with _lock:
        if _runner is not None and _runner[0].is_alive() and not _runner[1].is_set():
            return _runner[1]
        stop = threading.Event()
        thread = threading.Thread(target=_run, args=(interval_s, stop), name="pagoda-metric-snapshots",
                                  daemon=True)
        thread.start()
        _runner = (thread, stop)
        return stop


def stop_snapshot_runner(*, timeout: float = 10.0) -> None:
    """Stop the runner and wait for its current run to end (tests, shutdown)."""
    with _lock:
        runner = _runner
    if runner is not None:
        runner[1].set()
        runner[0].join(timeout)
