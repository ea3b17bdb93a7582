"""Readiness checks: can this process serve API requests right now?

A reason is a fixed sentence (which check failed), never the driver's exception text: that goes to
the log. /readyz shows the reasons only to staff or a caller presenting PAGODA_READYZ_TOKEN.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection

from webapp.registry.selectors import modelversion_list_active

REDIS_TIMEOUT_S = 2.0
logger = logging.getLogger(__name__)


def check_database() -> str | None:
    """None when fine, else the reason."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:  # any driver error means "not ready"
        logger.warning("readiness: the database is unreachable", exc_info=True)
        return "database unreachable"
    return None


def check_redis() -> str | None:
    if not settings.REDIS_URL:
        return None  # embedded mode: no Redis to need
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_S,
                             socket_connect_timeout=REDIS_TIMEOUT_S).ping()
    except Exception:
        logger.warning("readiness: Redis is unreachable", exc_info=True)
        return "redis unreachable"
    return None


def check_workers() -> list[str]:
    """A reason for every active model that no live, non-draining worker serves."""
    from workers.connect import get_engine_client
    from workers.transport import is_serving

    workers = get_engine_client(settings.REDIS_URL).live_workers()
    serving = {w.model for w in workers if is_serving(w)}  # not draining, engine healthy
    return [f"no live worker serves the model {v.model.slug!r}" for v in modelversion_list_active()
            if v.model.slug not in serving]


def readiness() -> tuple[dict, list[str]]:
    """(check name -> "ok" | reason, every reason)."""
    checks: dict[str, str] = {}
    reasons: list[str] = []
    database = check_database()
    checks["database"] = database or "ok"
    if database:
        reasons.append(database)
    redis_reason = check_redis()
    checks["redis"] = redis_reason or ("ok" if settings.REDIS_URL else "not configured")
    if redis_reason:
        reasons.append(redis_reason)
    if not database and not redis_reason:
        missing = check_workers()
        checks["workers"] = "; ".join(missing) or "ok"
        reasons.extend(missing)
    return checks, reasons
