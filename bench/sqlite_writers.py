"""Many writers of one process at once on SQLite: Django's stock backend against Pagoda's
(webapp/config/sqlite: writers queue on a process lock rather than in SQLite's sleeping busy
handler), side by side, alternated.

Each of ``--threads`` threads runs one transaction at the same moment (a barrier): the statements
of a usage record's close (read the running record, its price, update it, settle the key's
reservation and counters: 12 statements), on a temporary database file in IMMEDIATE mode, as
settings configure it. Prints each backend's median over ``--repeats`` of the slowest writer's
and the median writer's seconds. This is the tail a burst of streams ending in one engine step
waits before its last usage chunk.

    .venv/bin/python bench/sqlite_writers.py [--threads 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

BACKENDS = {"stock": "django.db.backends.sqlite3", "queued": "webapp.config.sqlite"}


def close_like_a_usage_record(connection, i: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT model, created FROM record WHERE id = %s AND status = 'running'", [i])
        cursor.execute("SELECT nanos FROM price WHERE model = 1 ORDER BY since DESC LIMIT 1")
        cursor.execute("UPDATE record SET status = 'ok', tokens = 148, cost = 37 WHERE id = %s", [i])
        cursor.execute("SAVEPOINT s")
        cursor.execute("SELECT id, tokens FROM reservation WHERE request = %s", [i])
        cursor.execute("UPDATE apikey SET reserved = reserved - 0, used = used + 148 WHERE id = 1")
        cursor.execute("RELEASE SAVEPOINT s")
        cursor.execute("SELECT 1 FROM reservation WHERE request = %s LIMIT 1", [-i])


def trial(alias: str, threads: int) -> tuple[float, float]:
    from django.db import connections, transaction

    barrier, took = threading.Barrier(threads), []

    def writer(i: int) -> None:
        barrier.wait()
        start = time.perf_counter()
        with transaction.atomic(using=alias):
            close_like_a_usage_record(connections[alias], i)
        took.append(time.perf_counter() - start)
        connections[alias].close()

    workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return max(took), statistics.median(took)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pagoda-sqlite-writers-"))
    options = {"transaction_mode": "IMMEDIATE", "timeout": 20}
    databases = {alias: {"ENGINE": engine, "NAME": str(folder / f"{alias}.sqlite3"), "OPTIONS": options}
                 for alias, engine in BACKENDS.items()}
    settings.configure(DATABASES={"default": databases["stock"], **databases}, USE_TZ=True)
    django.setup()
    from django.db import connections
    for alias in BACKENDS:
        with connections[alias].cursor() as cursor:
            cursor.execute("CREATE TABLE record (id INTEGER PRIMARY KEY, model INT, created TEXT, status TEXT, "
                           "tokens INT, cost INT)")
            cursor.execute("CREATE TABLE price (id INTEGER PRIMARY KEY, model INT, since TEXT, nanos INT)")
            cursor.execute("CREATE TABLE reservation (id INTEGER PRIMARY KEY, request INT, tokens INT)")
            cursor.execute("CREATE TABLE apikey (id INTEGER PRIMARY KEY, reserved INT, used INT)")
            cursor.execute("INSERT INTO price (model, since, nanos) VALUES (1, '2026-01-01', 5)")
            cursor.execute("INSERT INTO apikey (id, reserved, used) VALUES (1, 0, 0)")
            for i in range(args.threads):
                cursor.execute("INSERT INTO record (id, model, created, status) VALUES (%s, 1, 'now', 'running')", [i])
        connections[alias].close()
    results: dict[str, list[tuple[float, float]]] = {alias: [] for alias in BACKENDS}
    for repeat in range(args.repeats):
        order = list(BACKENDS) if repeat % 2 == 0 else list(BACKENDS)[::-1]
        for alias in order:
            results[alias].append(trial(alias, args.threads))
            print(f"[{repeat + 1}/{args.repeats}] {alias:<6} slowest {results[alias][-1][0] * 1000:7.1f} ms, "
                  f"median {results[alias][-1][1] * 1000:7.1f} ms", flush=True)
    print(f"\n{args.threads} writers at once, medians of {args.repeats} alternated runs")
    for alias in BACKENDS:
        slowest = statistics.median(r[0] for r in results[alias])
        median = statistics.median(r[1] for r in results[alias])
        print(f"  {alias:<6} slowest writer {slowest * 1000:7.1f} ms, median writer {median * 1000:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
