"""Login throttling: failed logins counted per username and per client address in the cache.

PAGODA_LOGIN_MAX_FAILURES_PER_USER failures for one username (or PAGODA_LOGIN_MAX_FAILURES_PER_IP
from one address) within PAGODA_LOGIN_WINDOW_S seconds lock that username (or address) for
PAGODA_LOGIN_LOCKOUT_S seconds: attempts are refused before the password is checked, so a
guesser learns nothing more while the lock holds. A successful login clears its username's
count. Counters live in the default cache (Redis in distributed mode, so every web process sees
them). The address is REMOTE_ADDR: behind a reverse proxy, run Daphne with --proxy-headers so
that it is the client's and not the proxy's.
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.core.cache import cache

PREFIX = "pagoda:login"


def _subjects(*, username: str, ip: str | None) -> list[tuple[str, int]]:
    """(cache key stem, failure limit) for each thing a failure counts against."""
    # Hashed: usernames are client-chosen and cache keys have a charset and length limit.
    digest = hashlib.sha256(username.strip().casefold().encode()).hexdigest()[:32]
    subjects = [(f"{PREFIX}:user:{digest}", settings.PAGODA_LOGIN_MAX_FAILURES_PER_USER)]
    if ip:
        subjects.append((f"{PREFIX}:ip:{ip}", settings.PAGODA_LOGIN_MAX_FAILURES_PER_IP))
    return subjects


def login_locked_for(*, username: str, ip: str | None) -> float:
    """Seconds until a login for ``username`` from ``ip`` may be tried again; 0 when it may now."""
    now = time.time()
    until = [cache.get(f"{stem}:locked", 0) for stem, _ in _subjects(username=username, ip=ip)]
    return max([u - now for u in until] + [0.0])


def login_failure_record(*, username: str, ip: str | None) -> None:
    for stem, limit in _subjects(username=username, ip=ip):
        cache.add(f"{stem}:failures", 0, timeout=settings.PAGODA_LOGIN_WINDOW_S)
        try:
            failures = cache.incr(f"{stem}:failures")
        except ValueError:  # expired between add and incr: this failure opens a new window
            failures = 1
            cache.set(f"{stem}:failures", failures, timeout=settings.PAGODA_LOGIN_WINDOW_S)
        if failures >= limit:
            lockout = settings.PAGODA_LOGIN_LOCKOUT_S
            cache.set(f"{stem}:locked", time.time() + lockout, timeout=lockout)
            cache.delete(f"{stem}:failures")


def login_success_record(*, username: str) -> None:
    stem, _ = _subjects(username=username, ip=None)[0]
    cache.delete(f"{stem}:failures")
