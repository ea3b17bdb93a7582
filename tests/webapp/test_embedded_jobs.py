"""Embedded mode's background jobs: queued jobs leave the request that queued them, and the beat
schedule runs in the server process with Celery's own schedule objects."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from celery.signals import task_postrun
from django.conf import settings
from django.utils import timezone

from webapp.config.celery import app
from webapp.config.embedded_jobs import (_entries, embedded_server, enqueue, start_embedded_beat,
                                         stop_embedded_beat)
from webapp.usage.models import UsageDaily, UsageRecord
from webapp.usage.services import usage_record_create
from webapp.usage.tasks import usage_rollup_yesterday


@pytest.fixture
def embedded(monkeypatch):
    monkeypatch.setenv("PAGODA_EMBEDDED_WORKERS", "1")
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert embedded_server()


def _yesterdays_record() -> None:
    record = usage_record_create(request_id="y1", endpoint="completions", status="ok", latency=0.1,
                                 model_name="tiny", prompt_tokens=7, completion_tokens=3)
    UsageRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(days=1))


class Runs(list):
    """Names of the tasks that finished, in order; ``threads``: the thread each one ran in."""

    threads: list[str]


@pytest.fixture
def runs():
    """Names of the tasks that finished, in order (the job threads share SQLite's in-memory test
    database with this one, whose table locks make polling it from here fail spuriously)."""
    finished = Runs()
    finished.threads = []

    def record(sender=None, **_):
        finished.threads.append(threading.current_thread().name)
        finished.append(sender.name)

    task_postrun.connect(record, weak=False)
    yield finished
    task_postrun.disconnect(record)


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_flag_alone_is_not_embedded_when_redis_is_configured(monkeypatch):
    monkeypatch.setenv("PAGODA_EMBEDDED_WORKERS", "1")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert not embedded_server()
    monkeypatch.delenv("PAGODA_EMBEDDED_WORKERS")
    monkeypatch.delenv("REDIS_URL")
    assert not embedded_server()


@pytest.mark.django_db
def test_outside_the_embedded_server_an_eager_job_runs_in_the_caller(monkeypatch):
    monkeypatch.delenv("PAGODA_EMBEDDED_WORKERS", raising=False)
    _yesterdays_record()
    enqueue(usage_rollup_yesterday)
    assert UsageDaily.objects.get().prompt_tokens == 7


@pytest.mark.django_db(transaction=True)
def test_in_the_embedded_server_a_job_runs_in_another_thread(embedded, runs):
    _yesterdays_record()
    threads_before = {t.ident for t in threading.enumerate()}

    enqueue(usage_rollup_yesterday)
    # On a fast machine the job may be over before enqueue returns: ask the task where it ran.
    assert _wait_for(lambda: runs == ["usage.rollup_yesterday"])
    assert runs.threads == ["pagoda-job-usage.rollup_yesterday"] != [threading.current_thread().name]
    for thread in [t for t in threading.enumerate() if t.ident not in threads_before]:
        thread.join(5)
    assert UsageDaily.objects.get().prompt_tokens == 7


def test_every_beat_entry_names_a_registered_task_and_unknown_names_are_refused():
    entries = _entries(app, settings.CELERY_BEAT_SCHEDULE)
    assert {e.task.name for e in entries} >= {"usage.rollup_yesterday", "usage.purge_expired",
                                              "monitoring.snapshot_workers", "monitoring.purge_snapshots"}
    with pytest.raises(LookupError, match="nope.task"):
        _entries(app, {"typo": {"task": "nope.task", "schedule": 10}})


def test_a_daily_crontab_entry_is_not_due_at_start_but_is_after_a_day():
    entry = next(e for e in _entries(app, settings.CELERY_BEAT_SCHEDULE) if e.task.name == "usage.rollup_yesterday")
    due_now, next_s = entry.schedule.is_due(entry.last_run_at)
    due_later, _ = entry.schedule.is_due(entry.last_run_at - timedelta(days=1, minutes=1))
    assert not due_now and 0 < next_s <= 24 * 3600
    assert due_later


@pytest.mark.django_db(transaction=True)
def test_the_embedded_beat_runs_an_interval_entry_repeatedly_and_stops(runs):
    _yesterdays_record()
    started = time.monotonic()
    start_embedded_beat({"rollup": {"task": "usage.rollup_yesterday", "schedule": 0.2}})
    try:
        ran_three_times = _wait_for(lambda: len(runs) >= 3)
    finally:
        stop_embedded_beat()
    elapsed = time.monotonic() - started

    assert ran_three_times and set(runs) == {"usage.rollup_yesterday"}
    assert elapsed >= 3 * 0.2 * 0.9  # the first run is one period after the start, then every period
    assert not any(t.name == "pagoda-embedded-beat" for t in threading.enumerate())
    assert UsageDaily.objects.get().prompt_tokens == 7
