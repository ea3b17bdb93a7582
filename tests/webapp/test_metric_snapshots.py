"""Metric snapshots: a sample of a real embedded worker is stored with its figures, old samples
are purged, metrics.json buckets them per model as hand-worked below, and embedded mode's
in-process runner keeps sampling without Celery beat."""

import asyncio
import time
import uuid
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import OperationalError
from django.utils import timezone

from webapp.monitoring.figures import worker_figures
from webapp.monitoring.models import WorkerSnapshot
from webapp.config.embedded_jobs import start_embedded_beat, stop_embedded_beat
from webapp.monitoring.services import SNAPSHOT_FIELDS, snapshot_purge, snapshot_take
from webapp.monitoring.tasks import snapshot_workers
from workers import embedded
from workers.connect import get_engine_client
from workers.protocol import GenerateRequest

pytestmark = pytest.mark.db_engine

MODEL = "tiny-snapshots"
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "3", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture
def staff_client(client, db):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def _generate(max_tokens: int) -> str:
    req = GenerateRequest(f"req-{uuid.uuid4().hex}", MODEL, [5, 6, 7, 8, 9],
                          {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})

    async def run():
        return [chunk async for chunk in get_engine_client(None).generate(req)]

    chunks = asyncio.run(run())
    assert chunks[-1].finished and chunks[-1].error is None, chunks[-1]
    return chunks[-1].finish_reason


def _live_figures() -> dict:
    [info] = get_engine_client(None).live_workers(MODEL)
    return {"worker_id": info.worker_id, **worker_figures(info.stats)}


def _mine():
    return WorkerSnapshot.objects.filter(model_slug=MODEL)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_snapshot_of_a_real_worker_stores_its_figures(worker):
    assert _generate(24) == "length"
    deadline = time.monotonic() + 10  # a later heartbeat shows the request finished, with its latencies

    def settled(figures):
        return figures["itl_p50"] is not None and figures["num_running"] == 0
    while not settled(_live_figures()) and time.monotonic() < deadline:
        time.sleep(0.1)

    for _attempt in range(10):  # heartbeats refresh the stats every second: keep a sample they agree with
        before = _live_figures()
        stored = snapshot_workers()
        after = _live_figures()
        if before == after:
            break
        WorkerSnapshot.objects.all().delete()
    [row] = _mine()

    assert before == after and stored >= 1
    assert (row.version, row.worker_id) == ("3", before["worker_id"])
    assert {f: getattr(row, f) for f in SNAPSHOT_FIELDS} == {f: before[f] for f in SNAPSHOT_FIELDS}
    # 24 tokens were generated within the last seconds, nothing is left running or queued.
    assert row.tokens_per_s > 0 and (row.num_running, row.num_waiting) == (0, 0)
    assert 0 < row.ttft_p50 <= row.ttft_p95 and 0 < row.itl_p50 <= row.itl_p95
    assert 0 <= row.kv_cache_usage <= 1


@pytest.mark.django_db
def test_every_row_of_a_sample_shares_its_time(worker):
    moment = datetime(2026, 5, 1, 12, 0, 5, tzinfo=dt_timezone.utc)

    rows = snapshot_take(now=moment)

    assert [r.model_slug for r in rows if r.model_slug == MODEL] == [MODEL]
    assert {r.taken_at for r in WorkerSnapshot.objects.all()} == {moment}


@pytest.mark.django_db
def test_purge_removes_only_snapshots_older_than_the_retention(settings):
    settings.PAGODA_METRICS_RETENTION_HOURS = 48
    now = timezone.now()
    for hours_ago in (49, 47, 0.5):
        WorkerSnapshot.objects.create(taken_at=now - timedelta(hours=hours_ago), model_slug="m", version="1",
                                      worker_id=f"w-{hours_ago}")

    assert snapshot_purge(now=now) == 1
    assert sorted(WorkerSnapshot.objects.values_list("worker_id", flat=True)) == ["w-0.5", "w-47"]
    assert snapshot_purge(older_than_hours=1, now=now) == 1
    assert list(WorkerSnapshot.objects.values_list("worker_id", flat=True)) == ["w-0.5"]
    with pytest.raises(ValidationError, match="older_than_hours"):
        snapshot_purge(older_than_hours=0)


def _snap(at, worker_id, model="m", *, tokens, running, waiting, kv, ttft=(None, None), itl=(None, None)):
    WorkerSnapshot.objects.create(taken_at=at, model_slug=model, version="1", worker_id=worker_id,
                                  tokens_per_s=tokens, num_running=running, num_waiting=waiting,
                                  kv_cache_usage=kv, ttft_p50=ttft[0], ttft_p95=ttft[1], itl_p50=itl[0],
                                  itl_p95=itl[1])


@pytest.fixture
def samples(db):
    """Three samples of model "m" in one minute-aligned minute, two minutes ago (hand-worked in the
    tests below), one two hours ago, one older than a day, and another model."""
    now = timezone.now().timestamp()
    base = datetime.fromtimestamp(now // 60 * 60 - 120, dt_timezone.utc)
    t1, t2, t3 = (base + timedelta(seconds=s) for s in (1, 5, 12))
    # t1, two workers -> tokens 40, running 3, waiting 3, kv mean .4 max .6, ttft p50 mean .2 p95 max .5,
    # itl p50 .02 p95 .05 (w2 has no ITL yet).
    _snap(t1, "w1", tokens=10, running=1, waiting=0, kv=0.2, ttft=(0.1, 0.3), itl=(0.02, 0.05))
    _snap(t1, "w2", tokens=30, running=2, waiting=3, kv=0.6, ttft=(0.3, 0.5))
    # t2 -> tokens 20, running 0, waiting 1, kv .4/.4, ttft .2/.9, itl .04/.08
    _snap(t2, "w1", tokens=20, running=0, waiting=1, kv=0.4, ttft=(0.2, 0.9), itl=(0.04, 0.08))
    # t3 -> tokens 50, running 4, waiting 0, kv .8/.8, no latencies
    _snap(t3, "w2", tokens=50, running=4, waiting=0, kv=0.8)
    _snap(base - timedelta(hours=2), "w1", tokens=7, running=1, waiting=0, kv=0.1)
    _snap(base - timedelta(hours=25), "w1", tokens=99, running=9, waiting=9, kv=0.9)
    _snap(t1, "o1", model="other", tokens=1, running=0, waiting=0, kv=0.0)
    return base.timestamp()


def _approx(series: dict) -> dict:
    return {k: pytest.approx(v) if k != "t" else v for k, v in series.items()}


def test_one_hour_window_has_ten_second_buckets_summed_over_workers(staff_client, samples):
    data = staff_client.get("/console/metrics.json?window=1h&model=m").json()

    assert data["bucket_s"] == 10 and data["model_slugs"] == ["m", "other"] and list(data["models"]) == ["m"]
    # bucket 0 holds t1 and t2 (means of the per-sample figures, max of the maxima); bucket 10 holds t3.
    assert data["models"]["m"] == _approx({
        "t": [samples, samples + 10], "tokens_per_s": [30, 50], "num_running": [1.5, 4], "num_waiting": [2, 0],
        "kv_mean": [0.4, 0.8], "kv_max": [0.6, 0.8], "ttft_p50": [0.2, None], "ttft_p95": [0.9, None],
        "itl_p50": [0.03, None], "itl_p95": [0.08, None]})


def test_one_day_window_has_minute_buckets_and_reaches_back_a_day(staff_client, samples):
    data = staff_client.get("/console/metrics.json?window=1d").json()

    assert data["bucket_s"] == 60 and list(data["models"]) == ["m", "other"]
    assert data["models"]["m"] == _approx({
        "t": [samples - 7200, samples], "tokens_per_s": [7, 110 / 3], "num_running": [1, 7 / 3],
        "num_waiting": [0, 4 / 3], "kv_mean": [0.1, 1.6 / 3], "kv_max": [0.1, 0.8], "ttft_p50": [None, 0.2],
        "ttft_p95": [None, 0.9], "itl_p50": [None, 0.03], "itl_p95": [None, 0.08]})
    assert data["models"]["other"]["t"] == [samples]


def test_metrics_json_names_a_bad_window_and_is_for_staff_only(staff_client, client, samples):
    bad = staff_client.get("/console/metrics.json?window=1w")
    staff_client.logout()
    anonymous = client.get("/console/metrics.json?window=1h")
    get_user_model().objects.create_user("bob", password="pw")
    client.login(username="bob", password="pw")
    not_staff = client.get("/console/metrics.json")

    assert bad.status_code == 400 and "window" in bad.json()["error"] and "1w" in bad.json()["error"]
    assert anonymous.status_code == 302
    assert anonymous["Location"] == "/accounts/login/?next=/console/metrics.json%3Fwindow%3D1h"
    assert not_staff.status_code == 403


def test_workers_page_has_the_charts_and_their_empty_state(staff_client):
    page = staff_client.get("/console/workers/").content.decode()

    assert 'id="metric-charts"' in page and "/console/metrics.json" in page
    assert "vendor/uplot/uPlot.iife.min.js" in page and "console/charts.js" in page
    assert "No metric samples in this window yet" in page


def _num_samples_meanwhile() -> int:
    """The distinct sample times so far, read while the beat's thread writes: the test database is
    SQLite's shared-cache memory database, whose table locks fail a reader at once ("database
    table is locked") instead of waiting as a file database's busy timeout does; such a read
    counts as none yet."""
    try:
        return _mine().values("taken_at").distinct().count()
    except OperationalError as error:
        if "locked" not in str(error):
            raise
        return 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_embedded_beat_stores_a_sample_every_interval(worker):
    interval = 0.25
    start_embedded_beat({"snapshots": {"task": "monitoring.snapshot_workers", "schedule": interval}})
    try:
        deadline = time.monotonic() + 20 * interval
        while _num_samples_meanwhile() < 3 and time.monotonic() < deadline:
            time.sleep(interval / 5)
    finally:
        stop_embedded_beat()
    times = sorted(set(_mine().values_list("taken_at", flat=True)))

    assert len(times) >= 3
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    assert all(gap >= interval * 0.9 for gap in gaps), gaps


def test_beat_samples_every_interval_and_purges_the_old_samples(settings):
    schedule = {entry["task"]: entry for entry in settings.CELERY_BEAT_SCHEDULE.values()}

    assert schedule["monitoring.snapshot_workers"]["schedule"] == settings.PAGODA_METRICS_INTERVAL_S == 10
    assert schedule["monitoring.snapshot_workers"]["options"]["expires"] == 10
    assert "monitoring.purge_snapshots" in schedule
