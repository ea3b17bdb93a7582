"""Parsing of deployment settings from environment variables, kept apart so it is testable."""

from __future__ import annotations

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


def database_from_url(url: str | None, sqlite_path: Path) -> dict:
    """A Django DATABASES["default"] entry from DATABASE_URL.

    Unset or empty: SQLite at ``sqlite_path``. Understood schemes: ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db`` and ``postgres://user:password@host:port/name`` (also
    ``postgresql://``); query strings and other schemes are refused rather than guessed at.
    """
    if not url:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path}
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ImproperlyConfigured("DATABASE_URL: query strings and fragments are not supported")
    if parts.scheme == "sqlite":
        # sqlite:///db.sqlite3 -> path "/db.sqlite3" (relative); sqlite:////abs -> "//abs"
        name = unquote(parts.path[1:])
        if parts.netloc or not name:
            raise ImproperlyConfigured("DATABASE_URL: write sqlite:///relative or sqlite:////absolute")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
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
