"""SQLite whose writers in one process queue for the database's write lock in arrival order.

SQLite has one writer at a time (a transaction begins IMMEDIATE: settings' SQLITE_OPTIONS). A
writer that finds the lock taken waits in sqlite3's busy handler, which sleeps between retries
(1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms, then 100 ms at a time), however soon the lock
frees. Measured: 32 usage records closed at once (usage_record_finish in 32 threads, as when 32
streams end in one engine step; 4 ms transactions) took up to 1.16-1.36 s for the last, the
median 150-200 ms; queued here first, 156-194 ms and 82-109 ms. `bench/sqlite_writers.py` (a
close's 12 statements): the slowest of 32 writers 743 -> 53 ms.

Each transaction first takes its process's lock for the database file, waiting at most the
connection's ``timeout`` (then SQLite's own wait, as before); commit, rollback or close give it
back. Other processes (a Redis-mode worker, Celery) still meet at SQLite's lock. A
``threading.Lock``, not an RLock: a connection shared across threads (the test live server's)
may commit on another thread than the one that began.
"""

from __future__ import annotations

import threading

from django.db.backends.sqlite3 import base

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def write_lock(name: str) -> threading.Lock:
    """The process's lock for the database file ``name``."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    _write_lock: threading.Lock | None = None

    def _start_transaction_under_autocommit(self):
        lock = write_lock(str(self.settings_dict["NAME"]))
        timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        self._write_lock = lock if lock.acquire(timeout=timeout) else None
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._give_back()
            raise

    def _give_back(self) -> None:
        lock, self._write_lock = self._write_lock, None
        if lock is not None:
            lock.release()

    def _ending(self, end):
        """``end`` (the transaction's commit, rollback or close), then the lock given back."""
        try:
            return end()
        finally:
            self._give_back()

    def _commit(self):
        return self._ending(super()._commit)

    def _rollback(self):
        return self._ending(super()._rollback)

    def _close(self):
        return self._ending(super()._close)
