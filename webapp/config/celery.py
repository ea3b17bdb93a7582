"""The Celery app: broker is REDIS_URL; with REDIS_URL unset tasks run eagerly in the caller.

Start a worker with ``celery -A webapp.config.celery:app worker``. Configuration comes from
Django settings under the CELERY_ prefix (see settings/base.py).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.config.settings.serve")

app = Celery("pagoda")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # each installed app's tasks.py
