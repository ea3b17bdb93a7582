"""Embedded mode: the web process starts a worker for every active model version at start-up.

Called from RegistryConfig.ready(), where the database must not be queried yet (the app
registry is still being populated), so a short-lived thread waits for ``apps.ready`` and then
hands each active version to workers.transport.start_embedded_worker, which returns at once and
loads the model in its own daemon thread.
"""

from __future__ import annotations

import logging
import threading
import time

from django.apps import apps
from django.db import connection

logger = logging.getLogger(__name__)

APPS_READY_TIMEOUT_S = 60.0


def start_embedded_workers() -> list[str]:
    """Start (idempotently) a worker per active version; returns the slugs started."""
    from webapp.registry.selectors import modelversion_list_active
    from workers.transport import start_embedded_worker

    started = []
    for version in modelversion_list_active():
        try:
            start_embedded_worker(version.model.slug, version.label, version.path, dict(version.engine_settings))
        except Exception:  # one broken version must not keep the others from serving
            logger.exception("embedded worker for %s failed to start", version)
            continue
        logger.info("embedded worker starting for %s (%s)", version, version.path)
        started.append(version.model.slug)
    return started


def _start_after_setup() -> None:
    deadline = time.monotonic() + APPS_READY_TIMEOUT_S
    while not apps.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        start_embedded_workers()
    finally:
        connection.close()  # this thread's own connection


def start_embedded_workers_when_ready() -> None:
    threading.Thread(target=_start_after_setup, name="pagoda-embedded-start", daemon=True).start()
