from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from webapp.config.env import database_from_url, env_bool, env_list

DEFAULT_SQLITE = Path("/srv/pagoda/db.sqlite3")


def test_unset_database_url_means_sqlite_in_the_repo():
    assert database_from_url(None, DEFAULT_SQLITE) == {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DEFAULT_SQLITE,
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
