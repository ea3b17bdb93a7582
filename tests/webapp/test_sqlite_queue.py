"""webapp/config/sqlite: a process's writers queue for SQLite's write lock on a lock of their own,
taken when a transaction begins and given back at commit, rollback or close."""

import threading
import time

import pytest
from django.db import transaction
from django.db.utils import ConnectionHandler

from webapp.config.env import SQLITE_ENGINE, SQLITE_OPTIONS
from webapp.config.sqlite.base import write_lock

pytestmark = pytest.mark.sqlite


@pytest.fixture
def queued(tmp_path, monkeypatch, django_db_blocker):
    """A database file of its own behind Pagoda's SQLite backend, as ``transaction.atomic(using=
    "queued")`` finds it (each thread its own connection); returns the file's lock. Not the
    test database: pytest-django's blocker is lifted for it alone."""
    name = str(tmp_path / "queued.sqlite3")
    handler = ConnectionHandler({"default": {"ENGINE": SQLITE_ENGINE, "NAME": name, "OPTIONS": SQLITE_OPTIONS}})
    real = transaction.get_connection
    monkeypatch.setattr(transaction, "get_connection",
                        lambda using=None: handler["default"] if using == "queued" else real(using))
    with django_db_blocker.unblock():
        with handler["default"].cursor() as cursor:
            cursor.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER)")
            cursor.execute("INSERT INTO counter VALUES (1, 0)")
        yield handler, write_lock(name)
        handler.close_all()


def test_a_transaction_holds_the_lock_until_it_commits(queued):
    handler, lock = queued
    with transaction.atomic(using="queued"):
        assert lock.locked()
        with transaction.atomic(using="queued"):  # a savepoint: no second wait
            handler["default"].cursor().execute("UPDATE counter SET n = n + 1")
        assert lock.locked()
    assert not lock.locked()


def test_a_rolled_back_or_closed_transaction_gives_the_lock_back(queued):
    handler, lock = queued
    with pytest.raises(ZeroDivisionError), transaction.atomic(using="queued"):
        handler["default"].cursor().execute("UPDATE counter SET n = n + 1")
        1 / 0
    assert not lock.locked()
    with transaction.atomic(using="queued"):
        handler["default"].close()  # a connection closed mid-transaction (close_old_connections)
        assert not lock.locked()
    with transaction.atomic(using="queued"):
        row = handler["default"].cursor().execute("SELECT n FROM counter").fetchone()
    assert row == (0,) and not lock.locked()


def test_writers_of_one_process_take_turns_without_sqlite_sleeping(queued):
    """32 writers at once, each holding its transaction 5 ms: all of them through in about their
    sum. In SQLite's busy handler, which sleeps up to 100 ms between tries however soon the lock
    frees, the last took 0.65-1.05 s (bench/sqlite_writers.py, Django's stock backend)."""
    handler, lock = queued
    barrier, took, errors = threading.Barrier(32), [], []

    def writer():
        barrier.wait()
        start = time.perf_counter()
        try:
            with transaction.atomic(using="queued"):
                cursor = handler["default"].cursor()
                n = cursor.execute("SELECT n FROM counter").fetchone()[0]
                time.sleep(0.005)
                cursor.execute("UPDATE counter SET n = %s", [n + 1])
        except Exception as exc:  # a writer that failed
            errors.append(exc)
        finally:
            took.append(time.perf_counter() - start)
            handler["default"].close()

    threads = [threading.Thread(target=writer) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with transaction.atomic(using="queued"):
        assert handler["default"].cursor().execute("SELECT n FROM counter").fetchone() == (32,)
    assert max(took) < 0.6, f"the last writer waited {max(took):.2f} s for 32 x 5 ms"
    assert not lock.locked()
