"""The workers page: staff only, one row per real worker with its metrics, lost workers flagged."""

import time
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model

from webapp.console.selectors import percentile, worker_rows
from webapp.registry.models import Model, ModelVersion
from workers import embedded
from workers.connect import get_engine_client

MODEL = "tiny-console"
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}


@pytest.fixture
def staff_client(client, db):
    user = get_user_model().objects.create_user("admin", password="pw", is_staff=True)
    client.force_login(user)
    return client


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield
    embedded.stop_embedded_workers(drain_timeout=5)


def test_workers_page_is_for_staff_only(client, db):
    urls = ("/console/workers/", "/console/workers.json", "/console/usage/?group=model", "/console/usage.csv")
    anonymous = {url: client.get(url) for url in urls}
    get_user_model().objects.create_user("bob", password="pw")
    client.login(username="bob", password="pw")
    not_staff = {url: client.get(url) for url in urls}

    for url in urls:  # anonymous: the site's login, coming back here; logged in but not staff: 403
        assert anonymous[url].status_code == 302
        assert anonymous[url]["Location"] == f"/accounts/login/?next={quote(url)}"
        assert not_staff[url].status_code == 403 and b"Staff only" in not_staff[url].content


@pytest.mark.slow
def test_workers_json_lists_the_live_worker_and_models_without_one(staff_client, worker, tiny_llama_dir):
    for slug in (MODEL, "unserved"):
        model = Model.objects.create(slug=slug)
        ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf",
                                    status="active")

    data = staff_client.get("/console/workers.json").json()
    page = staff_client.get("/console/workers/")

    row = next(w for w in data["workers"] if w["model"] == MODEL)
    assert row["state"] == "live" and row["version"] == "1" and row["num_running"] == 0
    assert 0 <= row["heartbeat_age_s"] < 5 and row["uptime_s"] > 0 and row["kv_cache_usage"] == 0
    assert (row["num_preemptions"], row["num_paused_steps"]) == (0, 0)
    assert data["uncovered"] == [{"model": "unserved", "version": "1"}]
    assert page.status_code == 200 and b"No worker serves unserved v1." in page.content
    assert row["worker_id"].encode() in page.content


def test_a_worker_that_stops_heartbeating_shows_as_lost(db, tiny_llama_dir):
    model = "tiny-lost"
    embedded.start_embedded_worker(model, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(model, timeout=60)
    seen = [r for r in worker_rows() if r["model"] == model]
    embedded.stop_embedded_workers(drain_timeout=5)
    deadline = time.monotonic() + 15
    while get_engine_client(None).live_workers(model) and time.monotonic() < deadline:
        time.sleep(0.2)

    rows = [r for r in worker_rows() if r["model"] == model]

    assert [r["state"] for r in seen] == ["live"]
    assert [(r["worker_id"], r["state"]) for r in rows] == [(seen[0]["worker_id"], "lost")]


def test_percentile_is_nearest_rank():
    samples = [float(v) for v in range(1, 101)]  # 1..100

    assert percentile(samples, 50) == 50.0 and percentile(samples, 95) == 95.0
    assert percentile([0.2], 95) == 0.2 and percentile([], 50) is None
