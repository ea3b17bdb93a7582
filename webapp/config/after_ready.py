"""Start-up work that needs the database, started from an AppConfig.ready(), which may not query
it yet (the app registry is still being populated): a daemon thread waits for ``apps.ready``,
runs the work, logs what it raises, and closes the thread's own database connection."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.apps import apps
from django.db import connection

logger = logging.getLogger(__name__)

APPS_READY_TIMEOUT_S = 60.0


def _run(work: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + APPS_READY_TIMEOUT_S
    while not apps.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        work()
    except Exception:
        logger.exception("%s failed", what)
    finally:
        connection.close()


def when_apps_ready(work: Callable[[], object], what: str, thread_name: str) -> threading.Thread:
    """Run ``work`` in a daemon thread once the apps are ready; ``what`` names it in the log if it
    raises."""
    thread = threading.Thread(target=_run, args=(work, what), name=thread_name, daemon=True)
    thread.start()
    return thread
