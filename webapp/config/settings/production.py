"""Deployment behind TLS (docker-compose.yml, the Dockerfile): SECRET_KEY from the environment
(every web process must share it), DEBUG off, Secure cookies and HSTS.

TLS normally ends at a reverse proxy: set SECURE_PROXY_SSL_HEADER to the header it adds
(``X-Forwarded-Proto: https``) so Django knows which requests came in over HTTPS; the proxy
should also redirect plain HTTP, or set SECURE_SSL_REDIRECT=1 to have Django do it.
"""

import os

from django.core.exceptions import ImproperlyConfigured

from webapp.config.env import env_bool, env_list, proxy_ssl_header

from .base import *  # noqa: F403

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set in the environment in production")
DEBUG = False

# Origins allowed to POST forms (the console) when served behind another host name or HTTPS,
# e.g. "https://pagoda.example.com".
CSRF_TRUSTED_ORIGINS = env_list(os.environ, "CSRF_TRUSTED_ORIGINS", "")

# Cookies only over HTTPS. Browsers make an exception for http://localhost; SECURE_COOKIES=0
# for a plain-HTTP test install reached by another name.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool(os.environ, "SECURE_COOKIES", True)
# Browsers heed HSTS only on HTTPS responses; 0 turns it off. Subdomains and preload are
# opt-in: Pagoda cannot know what else runs under the same domain.
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool(os.environ, "SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool(os.environ, "SECURE_HSTS_PRELOAD", False)
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(os.environ.get("SECURE_PROXY_SSL_HEADER", ""))
SECURE_SSL_REDIRECT = env_bool(os.environ, "SECURE_SSL_REDIRECT", False)
# Probes and the Prometheus scrape talk plain HTTP inside the stack.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
