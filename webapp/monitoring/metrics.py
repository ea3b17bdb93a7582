"""Prometheus metrics, named after vLLM's with a ``pagoda:`` prefix.

Two sources: the live workers' heartbeats (WorkerInfo.stats, see workers/metrics.py), turned
into metric families at scrape time by WorkerStatsCollector, labelled per model and worker; and
this web process's own view of the API requests it served (``pagoda:api_*``), which includes
what the workers cannot see (authentication, tokenization, transport).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from workers.protocol import WorkerInfo

PREFIX = "pagoda:"
LABELS = ("model_name", "version", "worker")

REGISTRY = CollectorRegistry()

API_REQUESTS = Counter(f"{PREFIX}api_requests", "API requests finished, by outcome.",
                       ("model_name", "endpoint", "status"), registry=REGISTRY)
API_LATENCY = Histogram(
    f"{PREFIX}api_request_latency_seconds", "API request latency as the web process saw it.",
    ("model_name", "endpoint", "status"), registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0))
# By OpenAI error code (a bounded set: Pagoda's own codes), for the dashboard's errors-by-code panel.
API_ERRORS = Counter(f"{PREFIX}api_errors", "API requests that ended in an error, by error code.",
                     ("model_name", "endpoint", "code"), registry=REGISTRY)
# The gate in front of Django (webapp/config/gate.py): its refusals never reach the counters above
# (they come before the key and the model are known), and what it counts.
API_SHED = Counter(f"{PREFIX}api_requests_shed", "Generation requests refused (503 server_overloaded) before "
                   "Django because this web process had as many in flight as it can serve.", ("endpoint",),
                   registry=REGISTRY)
API_IN_FLIGHT = Gauge(f"{PREFIX}api_requests_in_flight", "Generation requests this web process is serving.",
                      registry=REGISTRY)
API_CAPACITY = Gauge(f"{PREFIX}api_requests_capacity", "Generation requests this web process serves at once "
                     "before refusing more (NaN: no bound, no serving worker).", registry=REGISTRY)
API_TTFT = Histogram(
    f"{PREFIX}api_time_to_first_token_seconds", "Time to first token of API requests, as the engine measured it.",
    ("model_name", "endpoint"), registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))

# stats key -> (metric name, help); gauges and counters read straight from WorkerInfo.stats.
GAUGES = {
    "num_running": ("num_requests_running", "Requests in the engine's running batch."),
    "num_waiting": ("num_requests_waiting", "Requests waiting to be scheduled."),
    "kv_cache_usage": ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1)."),
    "tokens_per_s": ("generation_tokens_per_second", "Tokens generated per second, recent window."),
    "num_lora_resident": ("lora_adapters_resident", "LoRA adapters resident in the engine (at most max_loras)."),
}
COUNTERS = {
    "prefix_cache_queried_tokens": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hit_tokens": ("prefix_cache_hits", "Prompt tokens served from the prefix cache."),
    "num_preemptions": ("num_preemptions", "Running requests preempted for lack of KV blocks."),
    "num_prompt_tokens": ("prompt_tokens", "Prompt tokens computed (prefix cache hits excluded)."),
    "num_generation_tokens": ("generation_tokens", "Tokens generated."),
    "num_lora_loads": ("lora_adapter_loads", "LoRA adapters made resident (first loads and reloads after eviction)."),
    "num_spec_drafts": ("spec_decode_num_drafts", "Speculative drafts verified (one per sequence and step that drafted)."),
    "num_spec_draft_tokens": ("spec_decode_num_draft_tokens", "Speculative draft tokens proposed."),
    "num_spec_accepted_tokens": ("spec_decode_num_accepted_tokens", "Speculative draft tokens accepted."),
    "num_paused_steps": ("num_paused_steps", "Engine steps paused between layers for another tenant's newcomer."),
}
HISTOGRAMS = {
    "time_to_first_token": ("time_to_first_token_seconds", "Time from request creation to its first token."),
    "time_per_output_token": ("time_per_output_token_seconds", "Time per output token after the first."),
    "e2e_latency": ("e2e_request_latency_seconds", "Time from request creation to its end."),
}


def observe_api_request(*, model: str, endpoint: str, status: str, latency: float,
                        time_to_first_token: float | None, error_code: str | None = None) -> None:
    API_REQUESTS.labels(model, endpoint, status).inc()
    if status == "error":
        API_ERRORS.labels(model, endpoint, error_code or "unknown").inc()
    API_LATENCY.labels(model, endpoint, status).observe(latency)
    if time_to_first_token is not None:
        API_TTFT.labels(model, endpoint).observe(time_to_first_token)


def observe_api_shed(endpoint: str) -> None:
    API_SHED.labels(endpoint).inc()


def watch_api_gate(in_flight: Callable[[], int], capacity: Callable[[], int | None]) -> None:
    """Report the gate's count and capacity, read at scrape time (nothing on a request's path)."""
    API_IN_FLIGHT.set_function(in_flight)
    API_CAPACITY.set_function(lambda: float("nan") if (value := capacity()) is None else value)


def _histogram(name: str, help_text: str, workers: list[tuple[list[str], dict]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=LABELS)
    for labels, data in workers:
        buckets = [(_le(bound), float(count)) for bound, count in zip(data["buckets"], data["counts"])]
        buckets.append(("+Inf", float(data["count"])))
        family.add_metric(labels, buckets, float(data["sum"]))
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def worker_families(workers: Iterable[WorkerInfo]):
    """Metric families of the given workers' heartbeat stats."""
    rows = [([w.model, w.version, w.worker_id], w.stats or {}) for w in workers]
    for key, (name, help_text) in GAUGES.items():
        family = GaugeMetricFamily(PREFIX + name, help_text, labels=LABELS)
        for labels, stats in rows:
            if key in stats:
                family.add_metric(labels, float(stats[key]))
        yield family
    for key, (name, help_text) in COUNTERS.items():
        family = CounterMetricFamily(PREFIX + name, help_text, labels=LABELS)
        for labels, stats in rows:
            if key in stats:
                family.add_metric(labels, float(stats[key]))
        yield family
    for key, (name, help_text) in HISTOGRAMS.items():
        with_data = [(labels, stats["latency"][key]) for labels, stats in rows
                     if key in (stats.get("latency") or {})]
        yield _histogram(PREFIX + name, help_text, with_data)


class WorkerStatsCollector(Collector):
    """Reads the live workers at every scrape (heartbeats are at most a second old)."""

    def __init__(self, live_workers: Callable[[], list[WorkerInfo]]):
        self.live_workers = live_workers

    def collect(self):
        yield from worker_families(self.live_workers())

    def describe(self):
        return []  # families depend on who is alive: nothing to check at registration


def _live_workers() -> list[WorkerInfo]:
    from django.conf import settings

    from workers.connect import get_engine_client

    return get_engine_client(settings.REDIS_URL).live_workers()


REGISTRY.register(WorkerStatsCollector(_live_workers))
