"""Deployment settings: SECRET_KEY must come from the environment; DEBUG off unless asked."""

import os

from django.core.exceptions import ImproperlyConfigured

from webapp.config.env import env_list

from .base import *  # noqa: F403

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set in the environment in production")

# Origins allowed to POST forms (the console) when served behind another host name or HTTPS,
# e.g. "https://pagoda.example.com".
CSRF_TRUSTED_ORIGINS = env_list(os.environ, "CSRF_TRUSTED_ORIGINS", "")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
