"""Reads behind the console's workers page: one row per worker, live or lost, and uncovered models.

Liveness comes from the engine client (a worker is live while its heartbeat is fresh). A worker
this web process saw before and no longer hears from is listed as "lost" for LOST_KEPT_S, so a
crash shows on the page instead of a row silently disappearing. (Each web process remembers the
workers it has seen itself.)
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

from webapp.monitoring.figures import percentile, worker_figures
from webapp.registry.selectors import modelversion_list_active
from workers.connect import get_engine_client
from workers.protocol import HEARTBEAT_INTERVAL_S, WorkerInfo

__all__ = ["percentile", "worker_rows", "models_without_worker"]  # percentile: re-exported

LOST_KEPT_S = 600.0
LATE_AFTER_S = 3 * HEARTBEAT_INTERVAL_S  # a live worker this quiet is flagged "late"

_seen: dict[str, WorkerInfo] = {}
_seen_lock = threading.Lock()


def _row(info: WorkerInfo, state: str, now: float) -> dict:
    return {
        "worker_id": info.worker_id, "model": info.model, "version": info.version, "host": info.host,
        "pid": info.pid, "state": state, "draining": info.draining,
        "uptime_s": round(now - info.started_at, 1), "heartbeat_age_s": round(now - info.last_heartbeat, 1),
        **worker_figures(info.stats),
        "engine_settings": (info.stats or {}).get("engine_settings") or {},  # effective, as it serves
    }


def worker_rows(*, now: float | None = None) -> list[dict]:
    """Every live worker, then the recently lost ones, sorted by model."""
    now = time.time() if now is None else now
    live = {info.worker_id: info for info in get_engine_client(settings.REDIS_URL).live_workers()}
    with _seen_lock:
        _seen.update(live)
        for worker_id in [w for w, info in _seen.items() if now - info.last_heartbeat > LOST_KEPT_S]:
            del _seen[worker_id]
        lost = [info for worker_id, info in _seen.items() if worker_id not in live]
    rows = [_row(info, "late" if now - info.last_heartbeat > LATE_AFTER_S else "live", now)
            for info in live.values()]
    rows += [_row(info, "lost", now) for info in lost]
    return sorted(rows, key=lambda row: (row["model"], row["state"] != "live", row["worker_id"]))


def models_without_worker(*, rows: list[dict]) -> list[dict]:
    """Active versions that no live worker serves: {"model", "version"}."""
    served = {(row["model"], row["version"]) for row in rows if row["state"] != "lost"}
    return [{"model": v.model.slug, "version": v.label} for v in modelversion_list_active()
            if (v.model.slug, v.label) not in served]
