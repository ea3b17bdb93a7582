"""The workers' Celery app: broker and result backend are REDIS_URL; unset, tasks run eagerly.

    celery -A workers.celery:app worker

Tasks are registered by name (``workers.<task>``) with ``shared_task``, so the webapp's own
Celery app can run them too once it includes ``workers.tasks``, and callers can queue them by
name without importing this package.
"""

from __future__ import annotations

import os

from celery import Celery

import workers.tasks  # noqa: F401  (registers the shared tasks, also for eager in-process use)


def make_app(redis_url: str | None) -> Celery:
    app = Celery("pagoda-workers", include=["workers.tasks"])
    app.conf.update(
        broker_url=redis_url or "memory://",
        result_backend=redis_url or None,
        task_always_eager=redis_url is None,  # embedded mode: run in the caller
        task_eager_propagates=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
    )
    return app


app = make_app(os.environ.get("REDIS_URL") or None)
