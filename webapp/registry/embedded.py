"""Embedded mode: the web process starts a worker for every active model version at start-up.

Called from RegistryConfig.ready(), where the database must not be queried yet (the app
registry is still being populated), so a short-lived thread waits for ``apps.ready`` and then
hands each active version to workers.embedded.start_embedded_worker, which returns at once and
loads the model in its own daemon thread; then it loads the web side's tokenizers (warm_up.py).
"""

from __future__ import annotations

import logging

from webapp.config.after_ready import when_apps_ready
from webapp.config.embedded_jobs import embedded_server, start_embedded_beat

logger = logging.getLogger(__name__)


def sync_embedded_worker(slug: str) -> str | None:
    """Make this process's worker for ``slug`` serve the model's active version, or none.

    Called after an activation, deactivation or settings edit commits. A new version (or new
    settings) loads while the old worker keeps serving, then the old one drains; no active
    version drains the model's worker. Returns the version label now served, None if none; a
    no-op returning None unless embedded workers are enabled.
    """
    if not embedded_server():
        return None
    from webapp.registry.selectors import modelversion_get_active
    from workers.embedded import start_embedded_worker, stop_embedded_worker

    version = modelversion_get_active(slug=slug)
    if version is None:
        stop_embedded_worker(slug)
        logger.info("embedded worker for %s draining: no active version", slug)
        return None
    start_embedded_worker(slug, version.label, version.path, dict(version.engine_settings))
    logger.info("embedded worker for %s serving %s (%s)", slug, version, version.path)
    return version.label


def start_embedded_workers() -> list[str]:
    """Start (idempotently) a worker per active version; returns the slugs started."""
    from webapp.registry.selectors import modelversion_list_active
    from workers.embedded import start_embedded_worker

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


def _start() -> None:
    from webapp.registry.warm_up import warm_tokenizers

    start_embedded_workers()
    warm_tokenizers()  # the web side's share, while the workers load


def start_embedded_workers_when_ready() -> None:
    when_apps_ready(_start, "starting the embedded workers", "pagoda-embedded-start")
    start_embedded_beat()  # no Celery beat in embedded mode: metric snapshots, usage roll-ups
