"""PostgreSQL in the suite: vendor markers and a throwaway server fixture.

``make test`` runs the suite on SQLite, then the database tests (tests/webapp) a second time with
DATABASE_URL on a PostgreSQL server it starts itself (deploy/stack/postgres.py). To run some tests
on PostgreSQL by hand:

    .venv/bin/python -m deploy.stack.postgres run -- .venv/bin/python -m pytest tests/webapp/test_x.py

Markers (declared in pytest.ini with the suite's others):

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

HOW_TO_RUN = "python -m deploy.stack.postgres run -- python -m pytest ..."


def django_vendor() -> str:
    """'postgresql' or 'sqlite': the engine of Django's default database in this run."""
    from django.db import connections

    return connections["default"].vendor  # the backend's own name: Pagoda's SQLite says "sqlite" too


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
    from deploy.stack.postgres import PostgresServer, find_binary

    if find_binary("initdb") is None:
        pytest.skip("PostgreSQL's initdb is not installed")

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


def run_behind_row_lock(table: str, pk: int, num_threads: int, work, timeout: float = 30.0) -> list:
    """``work(i)`` in ``num_threads`` threads, each on its own database connection, released at once.

    A separate connection holds ``SELECT ... FOR UPDATE`` on the row ``pk`` of ``table`` until
    PostgreSQL shows every thread waiting for a lock (pg_stat_activity), so their transactions
    really overlap at the statement that takes the row. Returns, in order, what each call returned
    or the exception it raised.
    """
    import threading
    import time

    from django.db import connections

    results: list = [None] * num_threads

    def run(i: int) -> None:
        try:
            results[i] = work(i)
        except Exception as exc:  # handed back to the test, which says what it expected
            results[i] = exc
        finally:
            connections.close_all()  # this thread's connections: none may outlive the test

    holder, watcher = connections.create_connection("default"), connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [pk])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(num_threads)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        while (waiting := _num_waiting_for_a_lock(watcher)) < num_threads:
            if time.monotonic() > deadline or not any(t.is_alive() for t in threads):
                holder.rollback()
                raise AssertionError(f"only {waiting} of {num_threads} threads queued behind the lock on {table}")
            time.sleep(0.01)
        holder.rollback()  # nothing was changed: the threads now contend for the row
        for thread in threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in threads), "a thread is still running"
    finally:
        holder.close()
        watcher.close()
    return results


def _num_waiting_for_a_lock(connection) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]
