"""A worker's headline figures from its heartbeat stats (workers/metrics.py describes them).

Pure and shared: the console's workers table (webapp/console/selectors.py) shows them live and
the metric snapshots (webapp/monitoring/services.py) store them, so both read the stats the same way.
"""

from __future__ import annotations


def percentile(samples: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of the samples; None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


def worker_figures(stats: dict | None) -> dict:
    """Queue, KV cache use, prefix hit rate, tokens/s, TTFT/ITL p50/p95 (over the worker's
    recent samples; None when it has none yet), speculative decoding's acceptance rate and
    tokens per drafting step (accepted drafts + the model's own token; None before any draft),
    and the scheduler's yields since the worker started: requests preempted for lack of KV
    blocks, steps paused between layers for another tenant's newcomer."""
    stats = stats or {}
    latency = stats.get("latency") or {}
    ttft = (latency.get("time_to_first_token") or {}).get("recent") or []
    tpot = (latency.get("time_per_output_token") or {}).get("recent") or []
    queried = stats.get("prefix_cache_queried_tokens") or 0
    drafts, draft_tokens = stats.get("num_spec_drafts") or 0, stats.get("num_spec_draft_tokens") or 0
    accepted = stats.get("num_spec_accepted_tokens") or 0
    return {
        "num_running": stats.get("num_running", 0), "num_waiting": stats.get("num_waiting", 0),
        "kv_cache_usage": stats.get("kv_cache_usage", 0.0),
        "prefix_cache_hit_rate": (stats.get("prefix_cache_hit_tokens", 0) / queried) if queried else None,
        "tokens_per_s": stats.get("tokens_per_s", 0.0),
        "ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95),
        "itl_p50": percentile(tpot, 50), "itl_p95": percentile(tpot, 95),
        "spec_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "spec_tokens_per_step": (accepted + drafts) / drafts if drafts else None,
        "num_preemptions": stats.get("num_preemptions", 0),
        "num_paused_steps": stats.get("num_paused_steps", 0),
    }
