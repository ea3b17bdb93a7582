"""A tiny OpenID Connect provider for Pagoda's single sign-on tests: django-oauth-toolkit with
OIDC on, its own SQLite database and RSA key, both named by the test in PAGODA_TEST_OIDC_CONFIG
(a JSON file; serve.py reads the rest of it). Test code only: never a provider to deploy."""

import json
import os
from pathlib import Path

CONFIG = json.loads(Path(os.environ["PAGODA_TEST_OIDC_CONFIG"]).read_text())

SECRET_KEY = "oidc-provider-test-key-not-for-deployment"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
                  "oauth2_provider"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
# Pagoda runs on 127.0.0.1 too, and cookies ignore the port: other names keep the two sessions apart.
SESSION_COOKIE_NAME = "provider_sessionid"
CSRF_COOKIE_NAME = "provider_csrftoken"
ROOT_URLCONF = "tests.oidc_provider.urls"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
              "DIRS": [Path(__file__).parent / "templates"],
              "OPTIONS": {"context_processors": ["django.template.context_processors.request"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": CONFIG["db"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/accounts/login/"
USE_TZ = True
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": Path(CONFIG["key_pem"]).read_text(),
    "OIDC_ISS_ENDPOINT": CONFIG["issuer"],
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.validator.GroupsClaimValidator",
    "SCOPES": {"openid": "OpenID Connect", "email": "e-mail", "profile": "profile", "groups": "groups"},
}
