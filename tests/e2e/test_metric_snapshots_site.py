"""Metric snapshots on real sites: embedded mode's server samples its own workers without Celery
beat, and in Redis mode the beat job, run by name in another process, samples the worker process."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time

import pytest

from tests.e2e.sites import TINY_SETTINGS, make_site

pytestmark = pytest.mark.e2e

INTERVAL_S = 0.5


def _snapshots(site, model: str) -> list[tuple]:
    with sqlite3.connect(site.db_path) as db:
        return db.execute("SELECT taken_at, worker_id, version, kv_cache_usage FROM monitoring_workersnapshot "
                          "WHERE model_slug = ? ORDER BY taken_at", (model,)).fetchall()


def test_the_embedded_server_samples_its_workers_every_interval(tmp_path_factory, tiny_llama_dir):
    site = make_site(tmp_path_factory.mktemp("snapshot_site"), {"PAGODA_METRICS_INTERVAL_S": str(INTERVAL_S)})
    site.manage("register_model", "tiny", str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    try:
        site.start_embedded("the embedded tiny worker coming up")
        started = time.monotonic()
        site.wait_until(lambda: len({row[0] for row in _snapshots(site, "tiny")}) >= 3,
                        "three snapshots of the embedded worker", timeout=20 * INTERVAL_S)
        waited = time.monotonic() - started
    finally:
        site.stop()
    rows = _snapshots(site, "tiny")

    assert waited < 20 * INTERVAL_S
    assert {(version, kv) for _, _, version, kv in rows} == {("1", 0.0)} and len({r[1] for r in rows}) == 1


def test_the_beat_job_samples_a_worker_process_through_a_celery_worker(redis_site):
    """What beat does every interval: queue monitoring.snapshot_workers by name on Redis, where a
    Celery worker process takes it and samples the engine worker process's heartbeat."""
    celery = redis_site.spawn("celery", [sys.executable, "-m", "celery", "-A", "webapp.config.celery:app",
                                         "worker", "--pool", "solo", "--loglevel", "INFO"])
    try:  # the job ignores its result (beat queues it every interval): watch the database instead
        redis_site.manage("shell", "-c", "from webapp.config.celery import app; "
                                         "app.send_task('monitoring.snapshot_workers')")
        redis_site.wait_until(lambda: _snapshots(redis_site, "tiny"), "the Celery worker storing a snapshot",
                              timeout=60)
        time.sleep(1)  # a second row would come now, if the job sampled anything twice
    finally:
        os.killpg(celery.pid, signal.SIGTERM)
        celery.wait(timeout=30)
        redis_site.procs.remove(celery)  # the session's site checks that its processes are alive
    rows = _snapshots(redis_site, "tiny")

    assert len(rows) == 1 and rows[0][2] == "1"  # the one engine worker process of tiny
    assert _snapshots(redis_site, "idle") == []  # an active model without a worker has no samples
    assert "monitoring.snapshot_workers" in redis_site.log("celery")
