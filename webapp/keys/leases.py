"""Which process holds a concurrency slot or a budget reservation, and whether it is still alive.

A web process (or a Celery worker running batch lines) that is killed mid-request cannot give
back what its requests took. Every process that takes something therefore holds a *lease*: its
``process_id`` (host, pid and a random part, new after a fork) and, in distributed mode, a Redis
key ``pagoda:leases:<process_id>`` that a daemon thread of the process renews every ``ttl / 6``
and that expires ``ttl`` (settings.PAGODA_LEASE_TTL_S, 30 s) after the last renewal. Slots and
reservations name their process; whatever a process without a lease holds is taken back by the
next request that finds the slots full or the budget short (a killed process's key works again
within the lease's ttl, not after SLOT_TTL_S).

Embedded mode has one web process, so a lease is only this process's id: what a previous run of
the server left behind (a reservation row in the database) names a process that is gone.

Taking back a slot may be early at no cost; closing a usage record as lost may not (its request
is aborted in the engine): ``RedisLease.gone`` calls a process dead only when its lease has been
missing at two looks at least GONE_CONFIRM_PERIODS renewals apart, so a lease that vanished with
a restarted Redis, and is renewed within one period, never counts.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import weakref

from django.conf import settings

logger = logging.getLogger(__name__)

LEASE_PREFIX = "pagoda:leases:"
MISSING_PREFIX = "pagoda:leases-missing:"  # a process seen without its lease: since when (the key's age)
MISSING_MARKER_TTL_S = 3600  # longer than any interval between two looks
GONE_CONFIRM_PERIODS = 2  # renewal periods (ttl / 6) between the two looks that find a lease missing

_lock = threading.Lock()
_process: tuple[int, str] | None = None  # (pid, process id): a forked child makes its own


def process_id() -> str:
    """This process's id, stable for its life and new in a forked child."""
    global _process
    with _lock:
        if _process is None or _process[0] != os.getpid():
            _process = (os.getpid(), f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")
        return _process[1]


class RedisLease:
    """This process's lease in Redis, renewed by a daemon thread from the first ``hold()`` on."""

    def __init__(self, redis_client) -> None:
        self._redis = redis_client
        self._held_by: int | None = None  # the pid whose renewal thread runs
        self._thread_lock = threading.Lock()
        # A process silent this long (killed, frozen) loses what its requests hold.
        self.ttl_s = max(1, round(settings.PAGODA_LEASE_TTL_S))

    def key(self, process: str) -> str:
        return LEASE_PREFIX + process

    def hold(self) -> str:
        """Renew the lease now (raises what Redis raises) and make sure the renewal thread runs."""
        process = process_id()
        self._redis.set(self.key(process), "1", ex=self.ttl_s)
        with self._thread_lock:
            if self._held_by != os.getpid():
                self._held_by = os.getpid()
                threading.Thread(target=_renew, args=(weakref.ref(self), process, self.ttl_s / 6),
                                 name="pagoda-lease", daemon=True).start()
        return process

    def alive(self, processes: set[str]) -> set[str]:
        """Which of ``processes`` hold a lease now."""
        processes = sorted(processes)
        if not processes:
            return set()
        with self._redis.pipeline(transaction=False) as pipe:
            for process in processes:
                pipe.exists(self.key(process))
            answers = pipe.execute()
        return {p for p, n in zip(processes, answers) if n}

    def gone(self, processes: set[str]) -> set[str]:
        """Which of ``processes`` are dead: without a lease now, and already without one at an
        earlier call at least GONE_CONFIRM_PERIODS renewal periods ago (measured by Redis's own
        clock: the age of a marker key set at the first look)."""
        alive = self.alive(processes)
        missing = sorted(processes - alive)
        marker_ttl_ms = MISSING_MARKER_TTL_S * 1000
        with self._redis.pipeline(transaction=False) as pipe:
            for process in alive:  # back (a Redis restart): the next loss is looked at afresh
                pipe.delete(MISSING_PREFIX + process)
            for process in missing:
                pipe.set(MISSING_PREFIX + process, "1", nx=True, px=marker_ttl_ms)
                pipe.pttl(MISSING_PREFIX + process)
            answers = pipe.execute()[len(alive):] if alive or missing else []
        confirm_ms = GONE_CONFIRM_PERIODS * self.ttl_s / 6 * 1000
        return {p for p, left in zip(missing, answers[1::2]) if marker_ttl_ms - left >= confirm_ms}


def _renew(lease_ref: weakref.ref, process: str, every_s: float) -> None:
    """Renew ``process``'s lease every ``every_s`` until the lease object is gone (its store was
    dropped) or the process forked (the child's own hold() starts its own thread)."""
    failing = False
    while True:
        time.sleep(every_s)
        lease = lease_ref()
        if lease is None or process_id() != process:
            return
        try:
            lease._redis.set(lease.key(process), "1", ex=lease.ttl_s)
        except Exception as exc:  # Redis away: what this process holds may be taken back
            if not failing:
                logger.warning("could not renew this process's lease %s (said once until it works "
                               "again): %s", process, exc)
            failing = True
        else:
            if failing:
                logger.info("this process's lease %s is renewed again", process)
            failing = False
        del lease
