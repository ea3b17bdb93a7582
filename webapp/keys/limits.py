"""Where per-key rate windows and concurrency counters live.

Distributed mode (REDIS_URL set): Redis, shared by every web process. Embedded mode: a dict in
this process, which is the only web process there. Both have the same interface:

- ``window_take(name, limit, now)``: count one request in the current one-minute window unless
  ``limit`` requests are already in it; returns seconds until the window ends when refused.
- ``window_add(name, amount, now)`` / ``window_total(name, now)``: tokens in the current window.
- ``slot_take(name, holder, limit, now)`` / ``slot_release(name, holder)``: a concurrency slot
  held by one request id. Slots expire after SLOT_TTL_S so a crashed process cannot leak them.

Windows are fixed calendar minutes (a client may burst up to twice the limit across a minute
boundary); the arithmetic is the same in both stores, which the tests check side by side.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict

from django.conf import settings

WINDOW_S = 60
SLOT_TTL_S = 3600  # longer than any request may run


def window_start(now: float) -> int:
    return int(now // WINDOW_S) * WINDOW_S


def seconds_left(now: float) -> int:
    return max(1, math.ceil(window_start(now) + WINDOW_S - now))


class MemoryLimitStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, int], int] = {}
        self._slots: dict[str, dict[str, float]] = defaultdict(dict)

    def _prune(self, now: float) -> None:
        # The previous minute stays readable, as in Redis (whose counters expire after 2 minutes).
        oldest = window_start(now) - WINDOW_S
        for key in [k for k in self._windows if k[1] < oldest]:
            del self._windows[key]

    def window_take(self, name: str, limit: int, now: float) -> int | None:
        with self._lock:
            self._prune(now)
            key = (name, window_start(now))
            if self._windows.get(key, 0) >= limit:
                return seconds_left(now)
            self._windows[key] = self._windows.get(key, 0) + 1
            return None

    def window_add(self, name: str, amount: int, now: float) -> None:
        with self._lock:
            self._prune(now)
            key = (name, window_start(now))
            self._windows[key] = self._windows.get(key, 0) + amount

    def window_total(self, name: str, now: float) -> int:
        with self._lock:
            return self._windows.get((name, window_start(now)), 0)

    def slot_take(self, name: str, holder: str, limit: int, now: float) -> bool:
        with self._lock:
            slots = self._slots[name]
            for stale in [h for h, t in slots.items() if t < now - SLOT_TTL_S]:
                del slots[stale]
            if holder not in slots and len(slots) >= limit:
                return False
            slots[holder] = now
            return True

    def slot_release(self, name: str, holder: str) -> None:
        with self._lock:
            self._slots[name].pop(holder, None)

    def slot_count(self, name: str) -> int:
        with self._lock:
            return len(self._slots[name])


# KEYS[1] window counter; ARGV: limit, ttl. Returns 1 when counted, 0 when the window is full.
_TAKE_WINDOW = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
# KEYS[1] sorted set holder -> taken-at; ARGV: holder, limit, now, ttl. 1 when held, 0 when full.
_TAKE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[4]))
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RedisLimitStore:
    def __init__(self, url: str, prefix: str = "pagoda:limits:") -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._prefix = prefix
        self._take_window = self._redis.register_script(_TAKE_WINDOW)
        self._take_slot = self._redis.register_script(_TAKE_SLOT)

    def _window_key(self, name: str, now: float) -> str:
        return f"{self._prefix}w:{name}:{window_start(now)}"

    def window_take(self, name: str, limit: int, now: float) -> int | None:
        counted = self._take_window(keys=[self._window_key(name, now)], args=[limit, 2 * WINDOW_S])
        return None if counted else seconds_left(now)

    def window_add(self, name: str, amount: int, now: float) -> None:
        key = self._window_key(name, now)
        with self._redis.pipeline() as pipe:
            pipe.incrby(key, amount).expire(key, 2 * WINDOW_S).execute()

    def window_total(self, name: str, now: float) -> int:
        return int(self._redis.get(self._window_key(name, now)) or 0)

    def slot_take(self, name: str, holder: str, limit: int, now: float) -> bool:
        return bool(self._take_slot(keys=[f"{self._prefix}s:{name}"], args=[holder, limit, now, SLOT_TTL_S]))

    def slot_release(self, name: str, holder: str) -> None:
        self._redis.zrem(f"{self._prefix}s:{name}", holder)

    def slot_count(self, name: str) -> int:
        return int(self._redis.zcard(f"{self._prefix}s:{name}"))


_store = None
_store_url: str | None = None
_store_lock = threading.Lock()


def get_limit_store():
    """The process-wide store for the current REDIS_URL setting (re-made if the setting changes)."""
    global _store, _store_url
    url = getattr(settings, "REDIS_URL", None)
    with _store_lock:
        if _store is None or url != _store_url:
            _store = RedisLimitStore(url) if url else MemoryLimitStore()
            _store_url = url
        return _store
