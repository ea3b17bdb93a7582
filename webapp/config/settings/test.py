"""pytest-django's settings: fast password hashing, fixed secret, no DEBUG."""

from webapp.config.env import SQLITE_ENGINE

from .base import *  # noqa: F403

SECRET_KEY = "test-secret-key-not-for-deployment"
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# The checkpoint thread's own connection would write beside each test's open transaction; the
# tests of checkpoints call Checkpoints.flush() themselves.
PAGODA_USAGE_CHECKPOINT_S = 0
# SQLite's test database in memory, said outright: pytest-django recognises SQLite by Django's own
# ENGINE string, and would otherwise give Pagoda's (webapp/config/sqlite) xdist suffixes to a
# file name ("test_/path/db.sqlite3_gw0").
if DATABASES["default"]["ENGINE"] == SQLITE_ENGINE:  # noqa: F405
    DATABASES["default"].setdefault("TEST", {"NAME": ":memory:"})  # noqa: F405
