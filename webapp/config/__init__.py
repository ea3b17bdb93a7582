"""Project wiring: settings, URLs, ASGI/WSGI entry points and the Celery app.

The Celery app is imported here so that it is the current app whenever Django is loaded
(web process, management commands, tests): ``@shared_task`` tasks then bind to it and, in
embedded mode, run eagerly instead of looking for a broker.
"""

from webapp.config.celery import app as celery_app

__all__ = ("celery_app",)
