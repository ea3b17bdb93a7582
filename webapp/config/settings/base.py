"""Settings shared by every deployment, read from the environment.

Embedded mode (REDIS_URL unset): SQLite, an in-memory channel layer, Celery tasks run eagerly
in the calling process. Distributed mode (REDIS_URL set): Redis carries the channel layer and
the Celery broker; DATABASE_URL usually points at PostgreSQL.
"""

import os
from pathlib import Path

from webapp.config.env import database_from_url, env_list, oidc_settings
from workers.config_file import load_config as load_pagoda_config

BASE_DIR = Path(__file__).resolve().parents[3]  # the repository root, where manage.py lives

SECRET_KEY = os.environ.get("SECRET_KEY", "")
DEBUG = False  # only the local (development) settings read DEBUG from the environment
ALLOWED_HOSTS = env_list(os.environ, "ALLOWED_HOSTS", "127.0.0.1,localhost")
PORT = int(os.environ.get("PORT", "8000"))

INSTALLED_APPS = [
    "daphne",  # first: its runserver replaces Django's with an ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "webapp.accounts",
    "webapp.monitoring",
    "webapp.registry",
    "webapp.audit",
    "webapp.orgs",
    "webapp.keys",
    "webapp.billing",
    "webapp.usage",
    "webapp.openai_api",
    "webapp.chat",
    "webapp.console",
    "webapp.batches",
    "webapp.search",
    "webapp.rag",
    "webapp.sharing",
]

MIDDLEWARE = [
    # Django's own by their dotted paths (its deploy checks look for these); under ASGI the handler
    # loads their event-loop subclasses in their place (webapp/config/middleware.py: no thread hop
    # for each hook of each request).
    # First, so that its headers (nosniff, Referrer-Policy, COOP) and the CSP reach static files too.
    "django.middleware.security.SecurityMiddleware",
    "webapp.config.security.ContentSecurityPolicyMiddleware",
    "webapp.config.static_files.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "webapp.audit.context.AuditContextMiddleware",  # who makes the changes of this request, from where
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.config.urls"
LOGIN_URL = "chat:login"
LOGIN_REDIRECT_URL = "chat:index"
LOGOUT_REDIRECT_URL = "chat:login"

# Single sign-on with OpenID Connect through mozilla-django-oidc (webapp/accounts/sso.py; the
# PAGODA_OIDC_* variables, docs/organisations.md): off until PAGODA_OIDC_CLIENT_ID is set. Sets
# PAGODA_SSO_ENABLED, PAGODA_LOCAL_LOGIN and, when on, the library's OIDC_* settings.
globals().update(oidc_settings(os.environ))
OIDC_AUTHENTICATION_CALLBACK_URL = "sso:callback"
OIDC_USE_PKCE = True
OIDC_TIMEOUT = 10  # seconds for each call to the provider: a hung provider is a failed login, not a hung one
AUTHENTICATION_BACKENDS = (["django.contrib.auth.backends.ModelBackend"] if PAGODA_LOCAL_LOGIN else []) + (  # noqa: F821
    ["webapp.accounts.sso.SsoBackend"] if PAGODA_SSO_ENABLED else [])  # noqa: F821
WSGI_APPLICATION = "webapp.config.wsgi.application"
ASGI_APPLICATION = "webapp.config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL"), BASE_DIR / "db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Served by the web process itself (WhiteNoise, webapp/config/static_files.py) whatever DEBUG says,
# straight from the finders: a self-hosted install needs neither collectstatic nor a file server.
STATIC_URL = "static/"
WHITENOISE_USE_FINDERS = True
WHITENOISE_ALLOW_ALL_ORIGINS = False  # nothing cross-origin loads them
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
MEDIA_URL = "media/"
MEDIA_ROOT = BASE_DIR / "media"

# Headers on every response (Django's defaults, stated: the README's "Security defaults").
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # no page script reads the token from the cookie

REDIS_URL = os.environ.get("REDIS_URL") or None

# The cache holds login throttling counters (webapp/accounts/throttle.py): shared by every web
# process through Redis in distributed mode, per process in embedded mode (there is one).
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5}}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Login throttling: this many failed logins within PAGODA_LOGIN_WINDOW_S for one username, or
# from one client address, refuse further attempts for that username or address (even with the
# right password) for PAGODA_LOGIN_LOCKOUT_S.
PAGODA_LOGIN_MAX_FAILURES_PER_USER = int(os.environ.get("PAGODA_LOGIN_MAX_FAILURES_PER_USER", "5"))
PAGODA_LOGIN_MAX_FAILURES_PER_IP = int(os.environ.get("PAGODA_LOGIN_MAX_FAILURES_PER_IP", "20"))
PAGODA_LOGIN_WINDOW_S = int(os.environ.get("PAGODA_LOGIN_WINDOW_S", "900"))
PAGODA_LOGIN_LOCKOUT_S = int(os.environ.get("PAGODA_LOGIN_LOCKOUT_S", "900"))

if REDIS_URL:
    # A socket timeout above channels_redis's 5 s blocking read (BZPOPMIN): redis-py's default is
    # 5 s too, and with it every idle chat socket failed with 1011 after five seconds.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15, "socket_connect_timeout": 5}]},
        },
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Read by webapp/config/celery.py through the CELERY_ namespace.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ALWAYS_EAGER = REDIS_URL is None  # embedded mode: tasks run in the caller
CELERY_TASK_EAGER_PROPAGATES = True
# A Redis outage: fail fast, and reconnect by itself (at startup too) once Redis is back.
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 2}
CELERY_REDIS_SOCKET_TIMEOUT = 5
CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = 2
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"one_line": {"()": "webapp.config.logging.OneLineFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "one_line"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's own loggers propagate to root; keep request noise at the chosen level.
        "django": {"level": LOG_LEVEL},
    },
}

# Usage retention: raw UsageRecords older than this many days are deleted once their day is
# rolled up into UsageDaily (webapp/usage/tasks.py). Both jobs run daily from Celery beat.
PAGODA_USAGE_RETENTION_DAYS = int(os.environ.get("PAGODA_USAGE_RETENTION_DAYS", "90"))
# SIGTERM to the web server: running API requests get this many seconds to finish (embedded
# workers drain within it), then they are aborted; see webapp/config/shutdown.py.
# These five are pagoda.yaml's `serving` section ($PAGODA_CONFIG; workers/config_file.py), each
# overridden by its environment variable; an unknown key or a bad value stops the start, naming it.
_SERVING = load_pagoda_config().serving
PAGODA_DRAIN_TIMEOUT = _SERVING["drain_timeout_s"]
# Load shedding (workers.transport.Admission; README "Operations"): requests of one model waiting
# for a worker, across web processes (unset: 2 x the serving workers' max_num_seqs), how long one
# may wait for a worker to start it, and how long it may take overall; beyond them: 503 + Retry-After.
PAGODA_MAX_QUEUED_PER_MODEL = _SERVING["max_queued_per_model"]
PAGODA_QUEUE_TIMEOUT_S = _SERVING["queue_timeout_s"]
PAGODA_REQUEST_TIMEOUT_S = _SERVING["request_timeout_s"]
# Generation requests one web process serves at once before refusing more (503 server_overloaded)
# in front of Django (webapp/config/gate.py); unset: the sequences the serving workers of every
# model run at once (their max_num_seqs, summed).
PAGODA_MAX_REQUESTS_IN_FLIGHT = _SERVING["max_requests_in_flight"]
# A killed web process's concurrency slots and budget reservations are taken back once its lease,
# renewed every few seconds while it lives, has been silent this long (webapp/keys/leases.py).
PAGODA_LEASE_TTL_S = float(os.environ.get("PAGODA_LEASE_TTL_S", "30"))
# /readyz names the failing check only to staff, or to a probe sending this in X-Readyz-Token.
PAGODA_READYZ_TOKEN = os.environ.get("PAGODA_READYZ_TOKEN", "")
from celery.schedules import crontab  # noqa: E402

CELERY_BEAT_SCHEDULE = {
    **globals().get("CELERY_BEAT_SCHEDULE", {}),
    # Just after midnight UTC, when yesterday is complete; the purge after the roll-up.
    "usage-rollup-yesterday": {"task": "usage.rollup_yesterday", "schedule": crontab(hour=0, minute=15)},
    "usage-purge-expired": {"task": "usage.purge_expired", "schedule": crontab(hour=0, minute=45)},
}
# A request's usage record is written "running" when it goes to a worker. Every
# PAGODA_USAGE_RECONCILE_INTERVAL_S the reconciler (webapp/usage/reconcile.py) ends, as
# web_process_lost with its worker's token counts, those whose web process died: within about
# PAGODA_LEASE_TTL_S + a third of it + two intervals of the death. Every
# PAGODA_USAGE_CHECKPOINT_S each web process writes its running requests' token counts so far
# into their records, in one transaction (webapp/usage/checkpoints.py): what embedded mode, whose
# worker dies with the process, bills after a crash. 0 turns the checkpoints off.
PAGODA_USAGE_RECONCILE_INTERVAL_S = float(os.environ.get("PAGODA_USAGE_RECONCILE_INTERVAL_S", "10"))
PAGODA_USAGE_CHECKPOINT_S = float(os.environ.get("PAGODA_USAGE_CHECKPOINT_S", "5"))
CELERY_BEAT_SCHEDULE = {
    **CELERY_BEAT_SCHEDULE,
    "usage-reconcile": {"task": "usage.reconcile", "schedule": PAGODA_USAGE_RECONCILE_INTERVAL_S,
                        "options": {"expires": PAGODA_USAGE_RECONCILE_INTERVAL_S}},
}

# Metric snapshots for the console's charts (webapp/monitoring/tasks.py): every live worker is
# sampled every PAGODA_METRICS_INTERVAL_S seconds (10 s: the window over which workers already
# average tokens/s, so sampling faster adds no information; 360 points per worker an hour) and
# samples older than PAGODA_METRICS_RETENTION_HOURS are purged hourly. Embedded mode has no beat:
# webapp/config/embedded_jobs.py runs this whole schedule in a thread of the server process.
PAGODA_METRICS_INTERVAL_S = float(os.environ.get("PAGODA_METRICS_INTERVAL_S", "10"))
PAGODA_METRICS_RETENTION_HOURS = int(os.environ.get("PAGODA_METRICS_RETENTION_HOURS", "48"))
CELERY_BEAT_SCHEDULE = {
    **CELERY_BEAT_SCHEDULE,
    # A sample nobody ran within one interval is stale: expire it rather than queue a backlog.
    "monitoring-snapshot-workers": {"task": "monitoring.snapshot_workers", "schedule": PAGODA_METRICS_INTERVAL_S,
                                    "options": {"expires": PAGODA_METRICS_INTERVAL_S}},
    "monitoring-purge-snapshots": {"task": "monitoring.purge_snapshots", "schedule": crontab(minute=5)},
}

# Chat documents (webapp.chat.grounding): up to this many characters, a conversation's documents are
# pasted whole into the prompt; past it, only the passages retrieved for each question are.
PAGODA_RAG_PASTE_MAX_CHARS = int(os.environ.get("PAGODA_RAG_PASTE_MAX_CHARS", "24000"))
# With an embedding model active, chunks and questions are embedded too and the two rankings fused.
PAGODA_RAG_EMBEDDINGS = os.environ.get("PAGODA_RAG_EMBEDDINGS", "1") == "1"
