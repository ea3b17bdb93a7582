"""Where rate windows and concurrency counters live, for API keys and chat users alike.

Distributed mode (REDIS_URL set): Redis, shared by every web process, each operation one Lua
script (atomic). Embedded mode: dicts in this process, which is the only web process there,
each operation under one lock. Both have the same interface and arithmetic, which the tests
check side by side:

- ``window_reserve(name, holder, amount, limit, now)``: put ``amount`` (1 for a request, the worst
  case for tokens) into the sliding window unless the last WINDOW_S seconds would then hold more
  than ``limit``. Returns None when taken; otherwise the seconds until enough of the window has
  slid out for it to fit (``math.inf`` when it never can: ``amount > limit``).
- ``window_settle(name, holder, amount)``: the holder's entry now counts ``amount`` (its real
  count, at most what it reserved); ``window_cancel(name, holder)`` removes it (a refused request).
- ``window_total(name, now)``: what the last WINDOW_S seconds hold.
- ``slot_take(name, holder, limit, now)`` / ``slot_release(name, holder)`` / ``slot_count(name)``:
  a concurrency slot (or a chat socket) held by one holder. Taking it again refreshes it. A slot
  names the process that took it (webapp.keys.leases): a full set first drops the slots of
  processes whose lease has lapsed (killed web processes), and every slot expires after SLOT_TTL_S.
- ``lease()``: this process's id, its lease renewed; ``processes_alive(ids)``: which of these
  process ids hold a lease (budget reservations name their process with them);
  ``processes_gone(ids)``: which are dead for certain (RedisLease.gone: the usage reconciler's).

Redis unreachable (down, restarting, a partition; RedisLimitStore only): an operation that takes
something (``window_reserve``, ``window_total``, ``slot_take``, ``slot_count``) raises
LimitStoreUnavailable within the client's timeouts, and for UNAVAILABLE_RECHECK_S after a failure
at once, without touching the network, so a request refused for it is not slowed down again by
its own clean-up. One that gives something back (``window_settle``, ``window_cancel``,
``slot_release``) never raises for it: it logs a warning and is replayed by the next operation that
reaches Redis (up to MAX_DEFERRED of them; a slot left behind anyway expires after SLOT_TTL_S, a
window entry after WINDOW_S). Nothing keeps the outage: the first operation after it reconnects.

The window is a sliding log (one entry per request, at the moment it was admitted), not calendar
minutes: no 60 seconds ever hold more than the limit, so a burst at a minute's end and another at
the next one's start is refused, and the retry time is exact: the moment the oldest entries that
must leave have left. Entries are bounded by the requests admitted in a minute.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict, deque

from django.conf import settings

from webapp.keys.leases import LEASE_PREFIX, RedisLease, process_id

logger = logging.getLogger(__name__)
WINDOW_S = 60
SLOT_TTL_S = 3600  # longer than any request may run
UNAVAILABLE_RECHECK_S = 1.0  # after a failure, fail at once for this long before trying Redis again
MAX_DEFERRED = 10_000  # give-backs kept for replay while Redis is unreachable (the oldest dropped beyond)


class LimitStoreUnavailable(Exception):
    """The limit store (Redis) cannot be reached: the request cannot be checked against its limits."""


def _retry_after(entries: list[tuple[float, int]], used: int, amount: int, limit: int, now: float) -> float:
    """Seconds until ``amount`` fits, ``entries`` (taken-at, amount) oldest first."""
    if amount > limit:
        return math.inf
    for taken_at, counted in entries:
        used -= counted
        if used + amount <= limit:
            return max(0.0, taken_at + WINDOW_S - now)
    return 0.0


class MemoryLimitStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, dict[str, list]] = defaultdict(dict)  # name -> holder -> [taken_at, amount]
        self._slots: dict[str, dict[str, float]] = defaultdict(dict)

    def _live(self, name: str, now: float) -> dict[str, list]:
        window = self._windows[name]
        for holder in [h for h, (t, _) in window.items() if t <= now - WINDOW_S]:
            del window[holder]
        return window

    def window_reserve(self, name: str, holder: str, amount: int, limit: int, now: float) -> float | None:
        with self._lock:
            window = self._live(name, now)
            used = sum(a for h, (_, a) in window.items() if h != holder)
            if used + amount <= limit:
                window[holder] = [now, amount]
                return None
            entries = sorted((t, a) for h, (t, a) in window.items() if h != holder)
            return _retry_after(entries, used, amount, limit, now)

    def window_settle(self, name: str, holder: str, amount: int) -> None:
        with self._lock:
            entry = self._windows[name].get(holder)
            if entry is not None:
                entry[1] = min(entry[1], amount)

    def window_cancel(self, name: str, holder: str) -> None:
        with self._lock:
            self._windows[name].pop(holder, None)

    def window_total(self, name: str, now: float) -> int:
        with self._lock:
            return sum(a for _, a in self._live(name, now).values())

    def slot_take(self, name: str, holder: str, limit: int, now: float) -> bool:
        with self._lock:
            slots = self._slots[name]
            for stale in [h for h, t in slots.items() if t <= now - SLOT_TTL_S]:
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

    def lease(self) -> str:
        return process_id()

    def processes_alive(self, processes: set[str]) -> set[str]:
        """The only web process of embedded mode is this one: any other id is a run that ended."""
        return processes & {process_id()}

    def processes_gone(self, processes: set[str]) -> set[str]:
        return processes - {process_id()}


# KEYS[1] sorted set holder -> taken-at, KEYS[2] hash holder -> amount; ARGV: holder, amount, limit,
# now, window. Returns "ok", or the seconds to wait as a string (Lua numbers become integers in
# replies), or "inf".
_WINDOW_RESERVE = """
local holder, amount, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, window = tonumber(ARGV[4]), tonumber(ARGV[5])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
for _, h in ipairs(gone) do redis.call('HDEL', KEYS[2], h) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local used = 0
local amounts = redis.call('HGETALL', KEYS[2])
for i = 1, #amounts, 2 do
  if amounts[i] ~= holder then used = used + tonumber(amounts[i + 1]) end
end
if used + amount <= limit then
  redis.call('ZADD', KEYS[1], now, holder)
  redis.call('HSET', KEYS[2], holder, amount)
  redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
  redis.call('EXPIRE', KEYS[2], math.ceil(window) + 1)
  return 'ok'
end
if amount > limit then return 'inf' end
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  if entries[i] ~= holder then
    used = used - tonumber(redis.call('HGET', KEYS[2], entries[i]) or '0')
    if used + amount <= limit then
      return tostring(math.max(0, tonumber(entries[i + 1]) + window - now))
    end
  end
end
return '0'
"""
# KEYS[2] hash holder -> amount; ARGV: holder, amount. Lowers a live entry to its real count.
_WINDOW_SETTLE = """
local counted = redis.call('HGET', KEYS[2], ARGV[1])
if counted and tonumber(ARGV[2]) < tonumber(counted) then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return 1
"""
_WINDOW_TOTAL = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[2]))
local used = 0
for _, h in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  used = used + tonumber(redis.call('HGET', KEYS[2], h) or '0')
end
return used
"""
# KEYS[1] sorted set holder -> taken-at, KEYS[2] hash holder -> process id; ARGV: holder, limit,
# now, ttl, process id, lease key prefix. 1 when held, 0 when full. When the set is full, the
# slots of processes without a lease (webapp.keys.leases) are dropped before it is judged full;
# the lease keys are built here (one Redis, not a cluster: they are not declared as KEYS).
_TAKE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[4]))
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  for _, h in ipairs(redis.call('HKEYS', KEYS[2])) do
    local p = redis.call('HGET', KEYS[2], h)
    if not redis.call('ZSCORE', KEYS[1], h) or redis.call('EXISTS', ARGV[6] .. p) == 0 then
      redis.call('ZREM', KEYS[1], h)
      redis.call('HDEL', KEYS[2], h)
    end
  end
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""


class RedisLimitStore:
    def __init__(self, url: str, prefix: str = "pagoda:limits:") -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        self._unreachable = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._prefix = prefix
        self._reserve = self._redis.register_script(_WINDOW_RESERVE)
        self._settle = self._redis.register_script(_WINDOW_SETTLE)
        self._total = self._redis.register_script(_WINDOW_TOTAL)
        self._take_slot = self._redis.register_script(_TAKE_SLOT)
        self._lease = RedisLease(self._redis)
        self._down_until = 0.0  # time.monotonic() before which Redis is taken as unreachable
        self._deferred: deque = deque(maxlen=MAX_DEFERRED)  # give-backs to replay: (function, args)
        self._deferred_lock = threading.Lock()

    def _call(self, operation, *args):
        """``operation(*args)`` against Redis; LimitStoreUnavailable when it cannot be reached."""
        if time.monotonic() < self._down_until:
            raise LimitStoreUnavailable("the limit store was unreachable a moment ago")
        try:
            if self._deferred:  # first what was given back during an outage: a take may need it
                self._replay()
            return operation(*args)
        except self._unreachable as exc:
            self._down_until = time.monotonic() + UNAVAILABLE_RECHECK_S
            raise LimitStoreUnavailable(f"the limit store is unreachable: {exc}") from exc

    def _give_back(self, operation, *args) -> None:
        """A give-back: done now, or kept for replay (a warning, never an exception) while Redis is unreachable."""
        try:
            self._call(operation, *args)
        except LimitStoreUnavailable as exc:
            self._deferred.append((operation, args))
            logger.warning("%s; %s%s deferred until it is back", exc, operation.__name__, args)

    def _replay(self) -> None:
        """The deferred give-backs, oldest first; an unreachable Redis stops it (the rest stay)."""
        with self._deferred_lock:
            replayed = 0
            while self._deferred:
                operation, args = self._deferred[0]
                operation(*args)
                self._deferred.popleft()
                replayed += 1
            if replayed:
                logger.info("limit store reachable again: %d deferred give-backs replayed", replayed)

    def _window_keys(self, name: str) -> list[str]:
        # One hash tag: both keys of a window land on the same Redis Cluster slot.
        return [f"{self._prefix}{{w:{name}}}:at", f"{self._prefix}{{w:{name}}}:amount"]

    def _do_window_reserve(self, name, holder, amount, limit, now):
        return self._reserve(keys=self._window_keys(name), args=[holder, amount, limit, repr(now), WINDOW_S])

    def window_reserve(self, name: str, holder: str, amount: int, limit: int, now: float) -> float | None:
        answer = self._call(self._do_window_reserve, name, holder, amount, limit, now)
        answer = answer.decode() if isinstance(answer, bytes) else str(answer)
        if answer == "ok":
            return None
        return math.inf if answer == "inf" else float(answer)

    def _do_window_settle(self, name, holder, amount):
        self._settle(keys=self._window_keys(name), args=[holder, amount])

    def window_settle(self, name: str, holder: str, amount: int) -> None:
        self._give_back(self._do_window_settle, name, holder, amount)

    def _do_window_cancel(self, name, holder):
        at, amounts = self._window_keys(name)
        with self._redis.pipeline() as pipe:  # MULTI/EXEC
            pipe.zrem(at, holder).hdel(amounts, holder).execute()

    def window_cancel(self, name: str, holder: str) -> None:
        self._give_back(self._do_window_cancel, name, holder)

    def _do_window_total(self, name, now):
        return int(self._total(keys=self._window_keys(name), args=[repr(now), WINDOW_S]))

    def window_total(self, name: str, now: float) -> int:
        return self._call(self._do_window_total, name, now)

    def _slot_keys(self, name: str) -> list[str]:
        return [f"{self._prefix}{{s:{name}}}", f"{self._prefix}{{s:{name}}}:process"]

    def _do_slot_take(self, name, holder, limit, now):
        process = self._lease.hold()  # renewed before the slot names it
        return bool(self._take_slot(keys=self._slot_keys(name),
                                    args=[holder, limit, repr(now), SLOT_TTL_S, process, LEASE_PREFIX]))

    def slot_take(self, name: str, holder: str, limit: int, now: float) -> bool:
        return self._call(self._do_slot_take, name, holder, limit, now)

    def _do_slot_release(self, name, holder):
        slots, processes = self._slot_keys(name)
        with self._redis.pipeline() as pipe:  # MULTI/EXEC
            pipe.zrem(slots, holder).hdel(processes, holder).execute()

    def slot_release(self, name: str, holder: str) -> None:
        self._give_back(self._do_slot_release, name, holder)

    def slot_count(self, name: str) -> int:
        return self._call(lambda: int(self._redis.zcard(self._slot_keys(name)[0])))

    def lease(self) -> str:
        return self._call(self._lease.hold)

    def processes_alive(self, processes: set[str]) -> set[str]:
        return self._call(self._lease.alive, processes)

    def processes_gone(self, processes: set[str]) -> set[str]:
        return self._call(self._lease.gone, processes)


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
