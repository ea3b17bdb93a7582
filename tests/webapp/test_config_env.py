from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from webapp.config.env import (data_dir, database_from_url, env_bool, env_list, proxy_ssl_header,
                                secret_key_from_file)

DEFAULT_SQLITE = Path("/srv/pagoda/db.sqlite3")


def test_unset_database_url_means_sqlite_in_the_repo():
    assert database_from_url(None, DEFAULT_SQLITE) == {
        "ENGINE": "webapp.config.sqlite",
        "NAME": DEFAULT_SQLITE,
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }


def test_postgres_url_is_split_into_django_fields_with_escapes_decoded():
    db = database_from_url("postgres://pagoda:p%40ss@db.internal:5433/pagoda", DEFAULT_SQLITE)

    assert db == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "pagoda",
        "USER": "pagoda",
        "PASSWORD": "p@ss",
        "HOST": "db.internal",
        "PORT": "5433",
    }


def test_sqlite_url_distinguishes_relative_and_absolute_paths():
    assert database_from_url("sqlite:///data/x.db", DEFAULT_SQLITE)["NAME"] == "data/x.db"
    assert database_from_url("sqlite:////var/x.db", DEFAULT_SQLITE)["NAME"] == "/var/x.db"


@pytest.mark.parametrize(
    "url",
    ["mysql://u:p@h/db", "postgres://u:p@h/db?sslmode=require", "postgres://u:p@h/", "sqlite://"],
)
def test_database_urls_we_cannot_honour_are_refused(url):
    with pytest.raises(ImproperlyConfigured):
        database_from_url(url, DEFAULT_SQLITE)


def test_env_bool_reads_common_spellings_and_refuses_others():
    assert env_bool({"DEBUG": "Yes"}, "DEBUG", False) is True
    assert env_bool({"DEBUG": "0"}, "DEBUG", True) is False
    assert env_bool({}, "DEBUG", True) is True
    with pytest.raises(ImproperlyConfigured, match="DEBUG"):
        env_bool({"DEBUG": "maybe"}, "DEBUG", False)


def test_env_list_splits_on_commas_and_drops_blanks():
    assert env_list({"ALLOWED_HOSTS": " a.example , b.example,, "}, "ALLOWED_HOSTS", "") == [
        "a.example",
        "b.example",
    ]
    assert env_list({}, "ALLOWED_HOSTS", "127.0.0.1,localhost") == ["127.0.0.1", "localhost"]


def test_the_secret_key_file_is_created_once_owner_only_and_reused(tmp_path):
    path = tmp_path / "pagoda" / "secret_key"

    key = secret_key_from_file(path)

    assert len(key) >= 50 and path.read_text().strip() == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert secret_key_from_file(path) == key
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"]  # nothing left aside


def test_a_secret_key_file_too_short_to_be_a_key_is_refused(tmp_path):
    path = tmp_path / "secret_key"
    path.write_text("short\n")
    with pytest.raises(ImproperlyConfigured, match="delete it"):
        secret_key_from_file(path)


def test_the_data_dir_is_pagoda_data_dir_else_the_xdg_data_home(tmp_path):
    assert data_dir({"PAGODA_DATA_DIR": str(tmp_path)}) == tmp_path
    assert data_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "pagoda"
    assert data_dir({}) == Path.home() / ".local" / "share" / "pagoda"


def test_the_proxy_ssl_header_is_read_as_name_and_value():
    assert proxy_ssl_header("X-Forwarded-Proto: https") == ("HTTP_X_FORWARDED_PROTO", "https")
    assert proxy_ssl_header("") is None
    with pytest.raises(ImproperlyConfigured):
        proxy_ssl_header("X-Forwarded-Proto")


def test_only_runserver_falls_back_to_the_development_settings():
    from manage import default_settings

    assert default_settings(["manage.py", "runserver"]) == "webapp.config.settings.local"
    for argv in (["manage.py"], ["manage.py", "migrate"], ["manage.py", "shell"], ["manage.py", "check"]):
        assert default_settings(argv) == "webapp.config.settings.serve"


@pytest.mark.e2e
def test_check_deploy_with_production_settings_warns_only_about_the_opt_in_choices(tmp_path):
    """Left to the operator, on purpose: HSTS for subdomains and preload (Pagoda cannot know the
    rest of the domain) and the HTTPS redirect (normally the TLS proxy's job; SECURE_SSL_REDIRECT=1)."""
    import os
    import re
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.config.settings.production",
           "SECRET_KEY": "k" * 20 + "-production-check-" + "z" * 30, "DATABASE_URL": f"sqlite:///{tmp_path / 'db'}"}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "ERROR"], cwd=repo,
                            env=env, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert set(re.findall(r"\(security\.(\w+)\)", result.stderr + result.stdout)) == {"W005", "W008", "W021"}
