"""Load shedding through the real stack: Daphne, Redis, one `run_engine_worker` process.

A site of its own whose Daphne runs with a queue bound of 4 (PAGODA_MAX_QUEUED_PER_MODEL) in
front of a worker of two sequences: a burst of 1,000 concurrent streams must be answered at
once, the excess with 503 + Retry-After in the OpenAI error format, while the Daphne process's
memory stays bounded, and the slowest refusal within REFUSAL_VS_401 times the slowest answer of the
same burst sent with a wrong key (each a 401 after one database read). A second Daphne on the same
database and Redis has a 50 ms overall deadline.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.e2e.sites import TINY_SETTINGS, Site, make_site

pytestmark = pytest.mark.e2e

MODEL = "shed"
MAX_QUEUED = 4
NUM_BURST = 1000
BURST_BUDGET_S = 240  # the whole burst, on two shared cores
REFUSAL_VS_401 = 2.5  # the slowest refusal against the slowest 401 of the same burst with a wrong key
REQUEST_TIMEOUT_S = 0.05  # the tiny model streams 500 tokens in well under a second when idle


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_llama_dir, redis_server):
    db = redis_server.rsplit("/", 1)[0] + "/2"  # its own database: no other site's workers
    site = make_site(tmp_path_factory.mktemp("shedding_site"), {"REDIS_URL": db})
    # A burst of usage records on SQLite (production runs PostgreSQL): writers take the lock at
    # BEGIN and wait for it, so that what is measured is the shedding, not SQLite's busy errors.
    with open(site.root / "e2e_settings.py", "a") as settings:
        settings.write('DATABASES["default"].setdefault("OPTIONS", {}).update(timeout=120, '
                       'transaction_mode="IMMEDIATE")\n')
    site.manage("register_model", MODEL, str(tiny_llama_dir), "--engine-settings",
                json.dumps({**TINY_SETTINGS, "max_num_seqs": 2}))
    site.key = site.create_key("shedding test")
    site.spawn("worker", [sys.executable, "manage.py", "run_engine_worker", "--model", MODEL])
    # A listen backlog that holds the burst (Twisted's default, 50, resets the rest at connect:
    # a property of the listening socket, before any of Pagoda's code runs).
    site.daphne = site.spawn("daphne", [
        sys.executable, "-m", "daphne", "-e", f"tcp:port={site.port}:interface=127.0.0.1:backlog={NUM_BURST}",
        "webapp.config.asgi:application"], {"PAGODA_MAX_QUEUED_PER_MODEL": str(MAX_QUEUED)})
    site.redis = redis.Redis.from_url(db)
    try:
        site.wait_until(lambda: site.metric("pagoda:num_requests_running", model_name=MODEL) is not None,
                        "the worker announcing itself over Redis")
        yield site
    finally:
        site.stop()


async def one_stream(http: httpx.AsyncClient, url: str, key: str, i: int) -> dict:
    body = {"model": MODEL, "prompt": f"Burst {i}", "max_tokens": 8, "temperature": 0, "stream": True,
            "ignore_eos": True}
    started = time.monotonic()
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body,
                               headers={"Authorization": f"Bearer {key}"}) as response:
            answered = time.monotonic() - started
            text = (await response.aread()).decode()
    except httpx.TransportError as exc:
        return {"status": type(exc).__name__, "answered_s": time.monotonic() - started}
    return {"status": response.status_code, "answered_s": answered, "text": text,
            "retry_after": response.headers.get("Retry-After")}


def percentiles(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"p50 {at(0.5):.2f} / p99 {at(0.99):.2f} / max {ordered[-1]:.2f} s"


def test_a_burst_of_1000_streams_sheds_the_excess_with_503_and_retry_after_in_bounded_memory(site):
    pid = site.daphne.pid
    rss_before = rss_mib(pid)

    async def burst(key: str):
        limits = httpx.Limits(max_connections=NUM_BURST, max_keepalive_connections=0)
        timeout = httpx.Timeout(BURST_BUDGET_S, connect=BURST_BUDGET_S, pool=BURST_BUDGET_S)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            tasks = [one_stream(http, site.url, key, i) for i in range(NUM_BURST)]
            return await asyncio.wait_for(asyncio.gather(*tasks), BURST_BUDGET_S)

    # The yardstick, on this machine at this moment: the same burst with a wrong key, each answered
    # 401 after one database read, is what this process's own pace through 1,000 requests costs.
    wrong_key = asyncio.run(burst("pgd-not-a-key"))
    assert {r["status"] for r in wrong_key} == {401}
    slowest_401 = max(r["answered_s"] for r in wrong_key)

    started = time.monotonic()
    results = asyncio.run(burst(site.key))
    took = time.monotonic() - started
    rss_after = rss_mib(pid)

    served = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] == 503]
    slowest_refusal = max(r["answered_s"] for r in refused)
    print(f"\n{NUM_BURST} streams in {took:.1f} s: {len(served)} served, {len(refused)} refused with 503 "
          f"(slowest refusal {slowest_refusal:.2f} s); Daphne RSS {rss_before:.0f} -> {rss_after:.0f} MiB; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"the same burst with a wrong key: 401s {percentiles([r['answered_s'] for r in wrong_key])}")
    if refused:
        print(f"refusals: {percentiles([r['answered_s'] for r in refused])}")
    if served:
        print(f"served, first event: {percentiles([r['answered_s'] for r in served])}")

    others = collections.Counter(r["status"] for r in results if r["status"] not in (200, 503))
    assert len(served) + len(refused) == NUM_BURST, others
    # How many are served depends on how fast this machine pushes requests through Django to the
    # queue; what must hold is that the excess is refused, and nothing else happens to anyone.
    assert served and len(refused) >= NUM_BURST // 4
    for r in served:
        assert r["text"].rstrip().endswith("data: [DONE]") and '"finish_reason": "length"' in r["text"]
    for r in refused:
        error = json.loads(r["text"])["error"]
        # queue_unavailable: under this burst on 2 cores the web process can be starved past its
        # Redis read timeout (5 s); still a 503 with Retry-After, never a hang (see the README).
        assert error["code"] in ("server_overloaded", "queue_timeout", "queue_unavailable"), error
        assert error["type"] == "server_error" and int(r["retry_after"]) >= 1
    assert slowest_refusal < 90  # no refusal waits for a queue deadline: the web process's own pace
    # Nor for the admitted requests' preparation (body, tokenizer, reservation, usage records: the
    # gate of webapp/openai_api/gate.py refuses before them): 1.4x the 401 burst's slowest,
    # against 4.9x before the gate (47.9 s against 9.7 s), on 2 shared cores.
    assert slowest_refusal < REFUSAL_VS_401 * slowest_401, (slowest_refusal, slowest_401)
    assert rss_after - rss_before < 1024  # what 1,000 open requests hold, not an unbounded queue
    assert site.redis.xlen(f"pagoda:requests:{MODEL}") == 0  # nothing left queued behind


def test_a_request_past_its_deadline_gets_503_request_timeout_and_a_usage_record(site):
    web = Site(site.root, site.env)  # a second Daphne with a short overall deadline
    web.spawn("daphne-deadline", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web.port),
                                  "webapp.config.asgi:application"],
              {"PAGODA_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)})
    try:
        web.wait_until(lambda: httpx.get(f"{web.url}/healthz", timeout=5).status_code == 200, "Daphne listening")
        started = time.monotonic()
        response = httpx.post(f"{web.url}/v1/completions", timeout=60,
                              headers={"Authorization": f"Bearer {site.key}"},
                              json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 500,
                                    "temperature": 0, "ignore_eos": True})
        took = time.monotonic() - started
    finally:
        web.stop()

    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "request_timeout"
    assert int(response.headers["Retry-After"]) >= 1
    assert took < REQUEST_TIMEOUT_S + 10
    record = site.usage(response.headers["X-Request-Id"])
    assert (record["status"], record["error_code"]) == ("error", "request_timeout")
