"""Parsing of deployment settings from environment variables, kept apart so it is testable."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def env_bool(environ: dict[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name} must be one of {TRUE_WORDS + FALSE_WORDS}, got {raw!r}")


def env_list(environ: dict[str, str], name: str, default: str) -> list[str]:
    raw = environ.get(name, default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """SECURE_PROXY_SSL_HEADER from ``"X-Forwarded-Proto: https"``; empty means no proxy."""
    if not raw.strip():
        return None
    name, sep, value = raw.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER must read 'Header-Name: value', got {raw!r}")
    return "HTTP_" + name.strip().upper().replace("-", "_"), value.strip()


def data_dir(environ: dict[str, str]) -> Path:
    """Where this user's Pagoda keeps what must not live in the repository (the secret key):
    ``$PAGODA_DATA_DIR``, else ``$XDG_DATA_HOME/pagoda``, else ``~/.local/share/pagoda``."""
    if environ.get("PAGODA_DATA_DIR"):
        return Path(environ["PAGODA_DATA_DIR"]).expanduser()
    xdg = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / "pagoda"


def secret_key_from_file(path: Path) -> str:
    """The key stored at ``path``; created on first use (random, readable by its owner only).

    Two processes starting together both end up with the same key: the new file is written
    aside and linked into place, which fails for the second one, who then reads the winner's.
    """
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        finally:
            aside.unlink()
        key = path.read_text().strip()
    if len(key) < 32:
        raise ImproperlyConfigured(f"{path} holds no usable secret key (fewer than 32 characters); "
                                   "delete it to have a new one generated")
    return key


# Writers take SQLite's lock when their transaction begins (not on their first write, when a
# deferred transaction that has read can only fail with "database is locked"), and wait for it up
# to 20 s: measured under a burst of 1,000 API requests, deferred transactions failed usage writes.
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}
# Django's SQLite backend, its writers in one process queued for that lock in arrival order
# rather than in SQLite's sleeping busy handler (webapp/config/sqlite/base.py).
SQLITE_ENGINE = "webapp.config.sqlite"


def database_from_url(url: str | None, sqlite_path: Path) -> dict:
    """A Django DATABASES["default"] entry from DATABASE_URL.

    Unset or empty: SQLite at ``sqlite_path``. Understood schemes: ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db`` and ``postgres://user:password@host:port/name`` (also
    ``postgresql://``); query strings and other schemes are refused rather than guessed at.
    """
    if not url:
        return {"ENGINE": SQLITE_ENGINE, "NAME": sqlite_path, "OPTIONS": SQLITE_OPTIONS}
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ImproperlyConfigured("DATABASE_URL: query strings and fragments are not supported")
    if parts.scheme == "sqlite":
        # sqlite:///db.sqlite3 -> path "/db.sqlite3" (relative); sqlite:////abs -> "//abs"
        name = unquote(parts.path[1:])
        if parts.netloc or not name:
            raise ImproperlyConfigured("DATABASE_URL: write sqlite:///relative or sqlite:////absolute")
        return {"ENGINE": SQLITE_ENGINE, "NAME": name, "OPTIONS": SQLITE_OPTIONS}
    if parts.scheme in ("postgres", "postgresql"):
        name = unquote(parts.path.lstrip("/"))
        if not name or "/" in name:
            raise ImproperlyConfigured("DATABASE_URL: postgres URLs must name one database")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    raise ImproperlyConfigured(f"DATABASE_URL: unsupported scheme {parts.scheme!r}")


OIDC_ENDPOINTS = {  # mozilla-django-oidc's setting: the environment variable that sets it
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "PAGODA_OIDC_AUTHORIZATION_ENDPOINT",
    "OIDC_OP_TOKEN_ENDPOINT": "PAGODA_OIDC_TOKEN_ENDPOINT",
    "OIDC_OP_USER_ENDPOINT": "PAGODA_OIDC_USERINFO_ENDPOINT",
    "OIDC_OP_JWKS_ENDPOINT": "PAGODA_OIDC_JWKS_ENDPOINT",
}


def oidc_settings(environ: dict[str, str]) -> dict:
    """Single sign-on's settings (webapp/accounts/sso.py) from ``PAGODA_OIDC_*``: off (no button,
    no backend) while PAGODA_OIDC_CLIENT_ID is unset; once set, every endpoint must be too.
    PAGODA_LOCAL_LOGIN=off turns password login off, which needs single sign-on on."""
    client_id = environ.get("PAGODA_OIDC_CLIENT_ID", "").strip()
    local_login = env_bool(environ, "PAGODA_LOCAL_LOGIN", True)
    if not client_id:
        if not local_login:
            raise ImproperlyConfigured("PAGODA_LOCAL_LOGIN=off needs single sign-on: set PAGODA_OIDC_CLIENT_ID "
                                       "and the PAGODA_OIDC_*_ENDPOINT variables, or nobody can log in")
        return {"PAGODA_SSO_ENABLED": False, "PAGODA_LOCAL_LOGIN": True}
    missing = [name for name in OIDC_ENDPOINTS.values() if not environ.get(name, "").strip()]
    if missing:
        raise ImproperlyConfigured(f"PAGODA_OIDC_CLIENT_ID is set, so single sign-on needs {', '.join(missing)} too")
    return {
        "PAGODA_SSO_ENABLED": True,
        "PAGODA_LOCAL_LOGIN": local_login,
        "PAGODA_OIDC_PROVIDER_NAME": environ.get("PAGODA_OIDC_PROVIDER_NAME", "").strip() or "single sign-on",
        "PAGODA_OIDC_ISSUER": environ.get("PAGODA_OIDC_ISSUER", "").strip(),  # checked against the id token's iss
        "PAGODA_OIDC_GROUPS_CLAIM": environ.get("PAGODA_OIDC_GROUPS_CLAIM", "").strip() or "groups",
        "PAGODA_OIDC_USERNAME_CLAIM": environ.get("PAGODA_OIDC_USERNAME_CLAIM", "").strip() or "preferred_username",
        "OIDC_CREATE_USER": env_bool(environ, "PAGODA_OIDC_CREATE_USERS", True),
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": environ.get("PAGODA_OIDC_CLIENT_SECRET", ""),
        "OIDC_RP_SCOPES": environ.get("PAGODA_OIDC_SCOPES", "").strip() or "openid email profile",
        "OIDC_RP_SIGN_ALGO": environ.get("PAGODA_OIDC_SIGN_ALGO", "").strip() or "RS256",
        **{setting: environ[name].strip() for setting, name in OIDC_ENDPOINTS.items()},
    }
