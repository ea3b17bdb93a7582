"""pytest-django's settings: fast password hashing, fixed secret, no DEBUG."""

from .base import *  # noqa: F403

SECRET_KEY = "test-secret-key-not-for-deployment"
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# The checkpoint thread's own connection would write beside each test's open transaction; the
# tests of checkpoints call Checkpoints.flush() themselves.
PAGODA_USAGE_CHECKPOINT_S = 0
