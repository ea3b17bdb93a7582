"""PostgreSQL in the suite: vendor markers and a throwaway server fixture.

``make test`` runs the suite on SQLite, then the database tests (tests/webapp) a second time with
DATABASE_URL on a PostgreSQL server it starts itself (deploy/stack/postgres.py). To run some tests
on PostgreSQL by hand:

    .venv/bin/python -m deploy.stack.postgres run -- .venv/bin/python -m pytest tests/webapp/test_x.py

Markers (registered in tests/conftest.py):

- ``@pytest.mark.postgres``: the test needs PostgreSQL as Django's database (full-text search,
  row locks that SQLite does not have); skipped in the SQLite run.
- ``@pytest.mark.sqlite``: the test is about SQLite itself (IMMEDIATE transactions, FTS5);
  skipped in the PostgreSQL run.

The ``postgres_server`` fixture is a server of the test's own (not Django's database), for tests
that start processes on PostgreSQL (the local stack); it skips when initdb is not on PATH.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

MARKERS = [
    "postgres: needs PostgreSQL as Django's database; skipped unless DATABASE_URL points at PostgreSQL",
    "sqlite: about SQLite itself; skipped when DATABASE_URL points at PostgreSQL",
]
HOW_TO_RUN = "python -m deploy.stack.postgres run -- python -m pytest ..."


def django_vendor() -> str:
    """'postgresql' or 'sqlite': the engine of Django's default database in this run."""
    from django.conf import settings

    return settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1].replace("sqlite3", "sqlite")


def skip_other_vendors(items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("postgres") or item.get_closest_marker("sqlite") for item in items):
        return
    vendor = django_vendor()
    skips = {"postgres": pytest.mark.skip(reason=f"needs PostgreSQL (DATABASE_URL): {HOW_TO_RUN}"),
             "sqlite": pytest.mark.skip(reason=f"about SQLite; the database here is {vendor}")}
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) and not vendor.startswith(marker):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of the test session's own (deploy.stack.postgres.PostgresServer, started;
    ``.url`` is its DATABASE_URL), stopped and removed at the end."""
    if shutil.which("initdb") is None:
        pytest.skip("PostgreSQL's initdb is not on PATH")
    from deploy.stack.postgres import PostgresServer

    root = Path(tempfile.mkdtemp(prefix="pagoda-test-postgres-"))  # /tmp: reachable by the postgres account
    server = PostgresServer(root)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
