"""Development on one machine (``make dev``, ``manage.py runserver``): DEBUG on unless DEBUG=0,
a throwaway secret key, embedded mode by default, static files re-read when they change."""

import os

from webapp.config.env import env_bool

from .base import *  # noqa: F403

SECRET_KEY = os.environ.get("SECRET_KEY") or "django-insecure-local-development-only"
DEBUG = env_bool(os.environ, "DEBUG", True)
WHITENOISE_AUTOREFRESH = DEBUG
