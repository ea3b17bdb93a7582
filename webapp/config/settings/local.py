"""Development on one machine: DEBUG on, a throwaway secret key, embedded mode by default."""

import os

from webapp.config.env import env_bool

from .base import *  # noqa: F403

SECRET_KEY = os.environ.get("SECRET_KEY") or "django-insecure-local-development-only"
DEBUG = env_bool(os.environ, "DEBUG", True)
