"""What a worker publishes with its heartbeat (``WorkerInfo.stats``).

``WorkerMetrics.snapshot()`` returns a JSON-ready dict:

- engine gauges: ``num_running``, ``num_waiting``, ``num_blocks``, ``num_free_blocks``,
  ``kv_cache_usage`` (0..1), ``num_lora_resident`` (LoRA adapters loaded), plus ``num_inflight``
  (requests this worker has claimed);
- counters since the worker started: ``prefix_cache_queried_tokens``,
  ``prefix_cache_hit_tokens``, ``num_preemptions``, ``num_prompt_tokens``,
  ``num_generation_tokens``, ``num_lora_loads``, ``num_requests`` (claimed), ``num_requests_finished``
  (``{"stop", "length", "abort", "error"}`` -> count), and speculative decoding's
  ``num_spec_drafts`` (a sequence's draft verified in a step), ``num_spec_draft_tokens`` and
  ``num_spec_accepted_tokens``, and ``num_paused_steps`` (steps paused between layers for another
  tenant's newcomer);
- ``tokens_per_s``: generated tokens per second over the last ``RATE_WINDOW_S``;
- ``latency``: ``{"time_to_first_token" | "time_per_output_token" | "e2e_latency": histogram}``
  where a histogram is ``{"buckets": [upper bounds, s], "counts": [cumulative, one per bucket],
  "sum": s, "count": n, "recent": [the last RECENT_SAMPLES values, oldest first]}`` — the
  Prometheus histogram shape (the +Inf bucket is ``count``), with recent samples for charts.

Latencies run from the request's ``created_at`` (so they include queueing before a worker
took it) to the first token / the end; time per output token excludes the first token.
"""

from __future__ import annotations

import bisect
import time
from collections import deque

RATE_WINDOW_S = 10.0
RECENT_SAMPLES = 100
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
FINISH_KINDS = ("stop", "length", "abort", "error")


class LatencyHistogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = tuple(buckets)
        self.bucket_counts = [0] * len(self.buckets)  # per bucket, not cumulative
        self.sum = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=RECENT_SAMPLES)

    def observe(self, value: float) -> None:
        value = max(0.0, float(value))
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.buckets):
            self.bucket_counts[index] += 1
        self.sum += value
        self.count += 1
        self.recent.append(value)

    def to_dict(self) -> dict:
        cumulative, total = [], 0
        for n in self.bucket_counts:
            total += n
            cumulative.append(total)
        return {"buckets": list(self.buckets), "counts": cumulative, "sum": self.sum,
                "count": self.count, "recent": list(self.recent)}


class WorkerMetrics:
    """Owned by the engine loop thread; ``snapshot()`` copies are read by the heartbeat thread."""

    def __init__(self):
        self.ttft = LatencyHistogram(TTFT_BUCKETS)
        self.tpot = LatencyHistogram(TPOT_BUCKETS)
        self.e2e = LatencyHistogram(E2E_BUCKETS)
        self.num_requests = 0
        self.num_finished = dict.fromkeys(FINISH_KINDS, 0)
        self._rate_points: deque[tuple[float, int]] = deque()  # (monotonic time, generation total)

    def request_claimed(self) -> None:
        self.num_requests += 1

    def request_finished(self, kind: str, *, e2e_s: float | None = None,
                         decode_s: float | None = None, num_output_tokens: int = 0) -> None:
        """``decode_s``: first token to last; only finished ("stop"/"length") requests are timed."""
        self.num_finished[kind if kind in self.num_finished else "error"] += 1
        if kind not in ("stop", "length"):
            return
        if e2e_s is not None:
            self.e2e.observe(e2e_s)
        if decode_s is not None and num_output_tokens > 1:
            self.tpot.observe(decode_s / (num_output_tokens - 1))

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def tokens_per_s(self, num_generation_tokens: int, now: float) -> float:
        points = self._rate_points
        points.append((now, num_generation_tokens))
        while len(points) > 2 and now - points[1][0] >= RATE_WINDOW_S:
            points.popleft()
        start_time, start_tokens = points[0]
        elapsed = now - start_time
        return (num_generation_tokens - start_tokens) / elapsed if elapsed > 0 else 0.0

    def snapshot(self, engine_stats, num_inflight: int) -> dict:
        """Everything as plain JSON values; ``engine_stats`` is an engine.EngineStats."""
        now = time.monotonic()
        return {
            "num_running": engine_stats.num_running,
            "num_waiting": engine_stats.num_waiting,
            "num_inflight": num_inflight,
            "num_blocks": engine_stats.num_blocks,
            "num_free_blocks": engine_stats.num_free_blocks,
            "kv_cache_usage": engine_stats.kv_cache_usage,
            "prefix_cache_queried_tokens": engine_stats.prefix_cache_queried_tokens,
            "prefix_cache_hit_tokens": engine_stats.prefix_cache_hit_tokens,
            "num_preemptions": engine_stats.num_preemptions,
            "num_prompt_tokens": engine_stats.num_prompt_tokens,
            "num_generation_tokens": engine_stats.num_generation_tokens,
            "num_lora_resident": engine_stats.num_lora_resident,
            "num_lora_loads": engine_stats.num_lora_loads,
            "num_spec_drafts": engine_stats.num_spec_drafts,
            "num_spec_draft_tokens": engine_stats.num_spec_draft_tokens,
            "num_spec_accepted_tokens": engine_stats.num_spec_accepted_tokens,
            "num_paused_steps": engine_stats.num_paused_steps,
            "tokens_per_s": self.tokens_per_s(engine_stats.num_generation_tokens, now),
            "num_requests": self.num_requests,
            "num_requests_finished": dict(self.num_finished),
            "latency": {"time_to_first_token": self.ttft.to_dict(),
                        "time_per_output_token": self.tpot.to_dict(),
                        "e2e_latency": self.e2e.to_dict()},
        }
