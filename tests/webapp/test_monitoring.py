"""/readyz says why it is not ready; /metrics exposes worker stats and API histograms."""

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from webapp.monitoring.figures import worker_figures
from webapp.monitoring.metrics import worker_families
from webapp.registry.models import Model, ModelVersion
from workers.metrics import E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, LatencyHistogram
from workers.protocol import WorkerInfo

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


TOKEN = {"HTTP_X_READYZ_TOKEN": "probe-secret"}


@pytest.fixture(autouse=True)
def readyz_token(settings):
    settings.PAGODA_READYZ_TOKEN = "probe-secret"


def test_readyz_is_ready_with_a_database_and_nothing_to_serve(client):
    response = client.get("/readyz", **TOKEN)

    assert response.status_code == 200
    assert response.json() == {"status": "ready",
                               "checks": {"database": "ok", "redis": "not configured", "workers": "ok"}}


def test_readyz_is_503_naming_an_active_model_without_a_worker(client):
    model = Model.objects.create(slug="tiny")
    ModelVersion.objects.create(model=model, number=1, path="/x.gguf", format="gguf", status="active")

    response = client.get("/readyz", **TOKEN)

    assert response.status_code == 503
    assert response.json()["reasons"] == ["no live worker serves the model 'tiny'"]


def test_readyz_is_503_when_the_configured_redis_is_unreachable_without_the_drivers_text(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    response = client.get("/readyz", **TOKEN)

    assert response.status_code == 503
    assert response.json()["reasons"] == ["redis unreachable"]
    assert "127.0.0.1" not in response.content.decode() and "Error" not in response.content.decode()


def test_readyz_tells_anonymous_callers_only_ready_or_not(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    anonymous = client.get("/readyz")
    wrong_token = client.get("/readyz", HTTP_X_READYZ_TOKEN="guess")
    settings.PAGODA_READYZ_TOKEN = ""
    no_token_configured = client.get("/readyz", HTTP_X_READYZ_TOKEN="")

    for response in (anonymous, wrong_token, no_token_configured):
        assert (response.status_code, response.json()) == (503, {"status": "unavailable"})


def test_readyz_shows_staff_the_failing_checks(client, settings, django_user_model):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    client.force_login(django_user_model.objects.create_user("ops", is_staff=True))

    response = client.get("/readyz")

    assert response.json()["reasons"] == ["redis unreachable"]


def parse(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_metrics_are_prometheus_text_with_the_api_request_counters(client):
    client.post("/v1/completions", data="{}", content_type="application/json")  # no key: not counted
    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = parse(response.content.decode())
    assert "pagoda:api_request_latency_seconds" in families
    assert "pagoda:num_requests_running" in families


def worker(stats: dict, worker_id: str = "w1") -> WorkerInfo:
    now = time.time()
    return WorkerInfo(worker_id=worker_id, model="tiny", version="3", host="h", pid=1, started_at=now,
                      last_heartbeat=now, max_num_seqs=4, max_model_len=256, stats=stats)


def test_worker_stats_become_vllm_named_gauges_counters_and_histograms():
    ttft, tpot, e2e = (LatencyHistogram(b) for b in (TTFT_BUCKETS, TPOT_BUCKETS, E2E_BUCKETS))
    ttft.observe(0.3)
    tpot.observe(0.1)
    e2e.observe(1.3)
    stats = {"num_running": 2, "num_waiting": 1, "kv_cache_usage": 0.25, "prefix_cache_queried_tokens": 96,
             "prefix_cache_hit_tokens": 32, "num_preemptions": 1, "num_prompt_tokens": 64,
             "num_generation_tokens": 11, "tokens_per_s": 5.5, "num_spec_drafts": 4,
             "num_spec_draft_tokens": 20, "num_spec_accepted_tokens": 15,
             "latency": {"time_to_first_token": ttft.to_dict(), "time_per_output_token": tpot.to_dict(),
                         "e2e_latency": e2e.to_dict()}}
    info = worker(stats)

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    class One(Collector):
        def collect(self):
            yield from worker_families([info])

    registry = CollectorRegistry()
    registry.register(One())
    families = parse(generate_latest(registry).decode())

    def value(name, sample_name=None):
        samples = [s for s in families[name].samples if s.name == (sample_name or name)]
        assert samples[0].labels == {"model_name": "tiny", "version": "3", "worker": "w1"}
        return samples[0].value

    assert value("pagoda:num_requests_running") == 2
    assert value("pagoda:num_requests_waiting") == 1
    assert value("pagoda:kv_cache_usage_perc") == 0.25
    assert value("pagoda:prefix_cache_queries", "pagoda:prefix_cache_queries_total") == 96
    assert value("pagoda:prefix_cache_hits", "pagoda:prefix_cache_hits_total") == 32
    assert value("pagoda:num_preemptions", "pagoda:num_preemptions_total") == 1
    assert value("pagoda:prompt_tokens", "pagoda:prompt_tokens_total") == 64
    assert value("pagoda:generation_tokens", "pagoda:generation_tokens_total") == 11
    assert value("pagoda:spec_decode_num_drafts", "pagoda:spec_decode_num_drafts_total") == 4
    assert value("pagoda:spec_decode_num_draft_tokens", "pagoda:spec_decode_num_draft_tokens_total") == 20
    assert value("pagoda:spec_decode_num_accepted_tokens", "pagoda:spec_decode_num_accepted_tokens_total") == 15
    ttft = {s.labels["le"]: s.value for s in families["pagoda:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")}
    assert ttft["0.25"] == 0 and ttft["0.5"] == 1 and ttft["+Inf"] == 1
    tpot_sum = [s.value for s in families["pagoda:time_per_output_token_seconds"].samples if s.name.endswith("_sum")]
    assert tpot_sum == [pytest.approx(0.1)]
    e2e_count = [s.value for s in families["pagoda:e2e_request_latency_seconds"].samples
                 if s.name.endswith("_count")]
    assert e2e_count == [1]


def test_the_workers_figures_state_speculative_acceptance_and_tokens_per_step():
    figures = worker_figures({"num_spec_drafts": 4, "num_spec_draft_tokens": 20, "num_spec_accepted_tokens": 15})
    assert figures["spec_acceptance_rate"] == 0.75
    assert figures["spec_tokens_per_step"] == 4.75  # (15 accepted + 4 tokens of the model's own) / 4 steps
    none = worker_figures({"num_spec_drafts": 0, "num_spec_draft_tokens": 0})
    assert none["spec_acceptance_rate"] is None and none["spec_tokens_per_step"] is None


def test_the_workers_figures_count_preemptions_and_paused_steps():
    figures = worker_figures({"num_preemptions": 3, "num_paused_steps": 7})
    assert (figures["num_preemptions"], figures["num_paused_steps"]) == (3, 7)
    assert worker_figures(None)["num_paused_steps"] == 0  # a worker before its first heartbeat's stats
