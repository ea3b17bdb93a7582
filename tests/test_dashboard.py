"""The Grafana dashboard (deploy/grafana/dashboards/pagoda.json) and the alert rules name only
metrics a real Pagoda exposes: a tiny model served by a real Daphne answers a completion and an
invalid request, its /metrics is scraped, and a real Prometheus (Debian's package) scraping the
same site evaluates every panel's and rule's expression without an error.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.sites import TINY_SETTINGS, free_port, make_site

REPO_ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = REPO_ROOT / "deploy/grafana/dashboards/pagoda.json"
RULES = REPO_ROOT / "deploy/prometheus/rules/pagoda.yml"
RULE_TESTS = REPO_ROOT / "deploy/prometheus/tests/pagoda.test.yml"
DATASOURCES = REPO_ROOT / "deploy/grafana/provisioning/datasources/pagoda.yml"
METRIC = re.compile(r"\b(pagoda:[a-z_]+|up)\b(?=\s*[{\[)])")
# What Prometheus itself adds to a scraped series, beside the labels in /metrics.
SCRAPE_LABELS = {"job", "instance"}
PROMETHEUS = shutil.which("prometheus")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def rule_exprs() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_every_panel_queries_the_provisioned_prometheus_and_covers_the_operators_questions():
    dashboard = json.loads(DASHBOARD.read_text())
    uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    titles = " | ".join(panel["title"].lower() for panel in dashboard["panels"])

    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {uid}
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["model_name", "version", "worker"]
    for topic in ("throughput", "time to first token", "inter-token", "queue", "kv cache", "prefix cache hit",
                  "preemptions", "errors by code"):
        assert topic in titles, topic
    quantiles = [e for e in dashboard_exprs() if "histogram_quantile(0.99" in e]
    assert len(quantiles) >= 2  # TTFT and inter-token percentiles, per model, version and worker
    assert all("by (model_name, version, worker, le)" in e for e in quantiles)


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_llama_dir):
    site = make_site(tmp_path_factory.mktemp("dashboard_site"))
    site.manage("register_model", "tiny", str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    key = site.create_key("dashboard")
    try:
        site.start_embedded("the embedded tiny worker coming up")
        headers = {"Authorization": f"Bearer {key}"}
        ok = httpx.post(f"{site.url}/v1/completions", headers=headers, timeout=60,
                        json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
        bad = httpx.post(f"{site.url}/v1/completions", headers=headers, timeout=60,
                         json={"model": "tiny", "prompt": "x", "max_tokens": 4, "temperature": 5})
        assert (ok.status_code, bad.status_code) == (200, 400)
        site.wait_until(lambda: (site.metric("pagoda:generation_tokens_total", model_name="tiny") or 0) >= 4,
                        "the worker's heartbeat counting the completion's tokens", timeout=30)
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="module")
def scrape(site) -> dict[str, set[frozenset]]:
    """Sample name -> the label-key sets it comes with, from one real /metrics."""
    samples: dict[str, set[frozenset]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{site.url}/metrics", timeout=10).text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).add(frozenset(sample.labels) - {"le"})
    return samples


@pytest.mark.slow
def test_every_metric_a_panel_or_rule_names_is_in_a_real_scrape(scrape):
    named = {m for expr in dashboard_exprs() + rule_exprs() for m in METRIC.findall(expr)} - {"up"}
    assert len(named) >= 12
    assert sorted(named - scrape.keys()) == []
    assert "pagoda:api_errors_total" in scrape  # the invalid request, counted by its code


@pytest.mark.slow
def test_the_alert_rule_tests_use_series_shaped_like_the_real_scrape(scrape):
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for series in test["input_series"]:
            name, _, labels = series["series"].partition("{")
            keys = frozenset(re.findall(r"(\w+)=", labels)) - SCRAPE_LABELS - {"le"}
            if name == "up":
                continue  # Prometheus's own series of each scrape
            assert keys in scrape[name], (name, sorted(keys), [sorted(k) for k in scrape[name]])


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (make system-deps installs it)")
def test_a_real_prometheus_scraping_pagoda_evaluates_every_panel_and_rule(site, tmp_path):
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "pagoda-web", "static_configs": [{"targets": [f"127.0.0.1:{site.port}"]}]}]}))
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(expr: str) -> dict:
        return httpx.get(api, params={"query": expr}, timeout=10).json()

    try:
        deadline = time.monotonic() + 60
        while True:
            try:  # before it is ready Prometheus answers 503 in plain text
                if httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=5).status_code == 200 and query(
                        'pagoda:generation_tokens_total{model_name="tiny"}')["data"]["result"]:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        grafana = {"$model_name": ".*", "$version": ".*", "$worker": ".*", "$__rate_interval": "1m"}
        failures, kv_series = {}, []
        for expr in dashboard_exprs() + rule_exprs():
            for variable, value in grafana.items():
                expr = expr.replace(variable, value)
            answer = query(expr)
            if answer.get("status") != "success":
                failures[expr] = answer.get("error")
            elif "kv_cache_usage_perc" in expr and "max by" in expr and "> 0.95" not in expr:
                kv_series = [r["metric"].get("model_name") for r in answer["data"]["result"]]
        up = query('up{job="pagoda-web"}')["data"]["result"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert failures == {}
    assert kv_series == ["tiny"]  # the KV panel draws the tiny worker, as Prometheus stored it
    assert [sample["value"][1] for sample in up] == ["1"]
