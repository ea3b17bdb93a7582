"""The token counts of running requests, written into their usage records now and then.

Why: a web process killed mid-answer cannot end its records. In distributed mode the reconciler
(webapp/usage/reconcile.py) bills what the worker reported; in embedded mode the worker died with
the process and reported nothing, so the record's own counts are all there is: without these
checkpoints, the prompt alone, however much of the answer the client had received.

How: each request that reaches a worker is watched here from then until it ends (``watch``,
``unwatch``: the API's requests, chat turns and batch lines alike); a daemon thread writes, every
PAGODA_USAGE_CHECKPOINT_S (0: never), the counts of the watched requests that moved since its
last write, in one transaction (which of them still run, then one UPDATE statement executed for
each): one commit per interval and process, however many requests run (bench/usage_checkpoint.py
measures it). The UPDATE names ``status = 'running'``, so it never
touches a record that has ended; a request whose record has ended is no longer watched.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from webapp.usage.models import UsageRecord
from webapp.usage.outcome import Outcome

logger = logging.getLogger(__name__)


@dataclass
class _Watched:
    outcome: Outcome
    started: float  # time.monotonic() the request arrived
    written: tuple | None = None  # the counts of the last checkpoint


def _counts(watched: _Watched) -> tuple[int | None, int, int]:
    outcome = watched.outcome
    return outcome.num_prompt_tokens, outcome.num_output_tokens, outcome.num_cached_tokens


MAX_ROWS_PER_READ = 500  # bounds one statement's parameters


def _groups(request_ids: list[str]):
    for start in range(0, len(request_ids), MAX_ROWS_PER_READ):
        yield request_ids[start:start + MAX_ROWS_PER_READ]


def _update_sql() -> str:
    """One row's checkpoint, run for every row with executemany: one statement parsed once (the ORM
    would build and compile a statement per row, or a CASE with a branch per row and field)."""
    table = connection.ops.quote_name(UsageRecord._meta.db_table)
    return (f"UPDATE {table} SET prompt_tokens = COALESCE(%s, prompt_tokens), completion_tokens = %s, "
            f"cached_prompt_tokens = %s, latency = %s WHERE request_id = %s AND status = %s")


class Checkpoints:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._thread: threading.Thread | None = None

    def watch(self, request_id: str, outcome: Outcome, started: float) -> None:
        """Checkpoint ``outcome``'s counts into the request's running record until ``unwatch``."""
        interval = settings.PAGODA_USAGE_CHECKPOINT_S
        with self._lock:
            self._watched[request_id] = _Watched(outcome, started)
            if interval > 0 and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, args=(interval,), name="pagoda-usage-checkpoints",
                                                daemon=True)
                self._thread.start()

    def unwatch(self, request_id: str) -> None:
        with self._lock:
            self._watched.pop(request_id, None)

    def flush(self) -> int:
        """Write the counts that moved since the last checkpoint, in one transaction; how many."""
        with self._lock:
            moved = {request_id: (watched, _counts(watched)) for request_id, watched in self._watched.items()
                     if _counts(watched) != watched.written}
        if not moved:
            return 0
        now = time.monotonic()
        with transaction.atomic():
            running = {r for group in _groups(list(moved)) for r in UsageRecord.objects.filter(
                request_id__in=group, status=UsageRecord.Status.RUNNING).values_list("request_id", flat=True)}
            with connection.cursor() as cursor:
                cursor.executemany(_update_sql(), [
                    (*moved[r][1], now - moved[r][0].started, r, UsageRecord.Status.RUNNING) for r in sorted(running)])
        ended = set(moved) - running
        with self._lock:
            for request_id, (watched, counts) in moved.items():
                watched.written = counts
            for request_id in ended:  # its end was written meanwhile (or a leak): stop watching
                self._watched.pop(request_id, None)
        return len(moved)

    def _run(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            try:
                self.flush()
            except Exception:
                logger.exception("usage checkpoint failed; trying again in %g s", interval)
                connection.close()  # this thread's; opened again by the next checkpoint


_checkpoints = Checkpoints()


def get_checkpoints() -> Checkpoints:
    """This process's checkpoints."""
    return _checkpoints
