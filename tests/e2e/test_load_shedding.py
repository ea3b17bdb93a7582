"""Load shedding through the real stack: Daphne, Redis, one `run_engine_worker` process.

A site of its own whose worker runs NUM_SEQS sequences at once, so that its Daphne's gate in front
of Django (webapp/config/gate.py) lets NUM_SEQS generation requests in at a time: a burst of 1,000
concurrent streams must be answered at once, the excess refused with 503 + Retry-After in the
OpenAI error format before Django sees it, the admitted streams served in about the time their
tokens take, and the Daphne process's memory bounded. A second Daphne on the same database and
Redis has a 50 ms overall deadline.

The burst is sent with bench/shedding.py's client (bare sockets in a selector loop: an HTTP library's
millisecond of CPU per request would be counted as the server's on a 2-core machine).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from bench.shedding import burst, figures, table
from tests.e2e.sites import TINY_SETTINGS, Site, make_site

pytestmark = pytest.mark.e2e

MODEL = "shed"
NUM_SEQS = 8  # the worker's max_num_seqs, so the gate's capacity
NUM_BURST = 1000
MAX_TOKENS = 128  # each stream's tokens (EOS ignored), as in the measurement of issue #31
BURST_BUDGET_S = 240  # the whole burst, on two shared cores
# The target (issue #31): every refusal within a second, p99 included. A refusal costs the gate tens
# of microseconds (tests/webapp/test_overload_gate.py); what is left is Daphne's own pace through
# 1,000 connections (Twisted, the application instance, the access log: about 0.35 ms of CPU each
# here), which no code of ours changes. So the bound is the target, or on a machine too loaded for
# Daphne itself to meet it, FLOOR_SLACK x the p99 of the same burst against a Daphne whose
# application refuses everything at once (tests/e2e/refusing_asgi.py). Here, on 2 shared cores (a
# Xeon with AMX) at load averages of 5 to 8: refusals p99 0.5-0.9 s, the yardstick's 0.5-0.9 s, at
# most 1.7x it (the admitted streams' preparation shares the process); 2.5 leaves room for that.
REFUSAL_P99_S = 1.0
FLOOR_SLACK = 2.5
# An admitted stream's bound: "the time its tokens take". Measured on the site itself just before
# the burst: FULL_BATCH_S, the time NUM_SEQS streams of MAX_TOKENS sent together take (the worker's
# full batch: its decode throughput, through the same HTTP path). At most the gate's capacity is in
# flight, so an admitted stream has at most ceil(capacity / NUM_SEQS) = 1 full batch of tokens to
# wait for: p99 <= FULL_BATCH_S x ADMITTED_SLACK + the refusals' bound. ADMITTED_SLACK (3) covers
# the worker sharing the 2 cores with the burst's client and Daphne while the burst lasts (a third
# of the CPU it had alone at worst); the refusals' bound, the burst arriving ahead of the admitted
# streams' own preparation. Measured here: p99 0.9-1.3x FULL_BATCH_S.
ADMITTED_SLACK = 3.0
REQUEST_TIMEOUT_S = 0.05  # the tiny model streams 500 tokens in well under a second when idle


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
                json.dumps({**TINY_SETTINGS, "max_num_seqs": NUM_SEQS}))
    site.key = site.create_key("shedding test")
    site.spawn("worker", [sys.executable, "manage.py", "run_engine_worker", "--model", MODEL])
    # A listen backlog that holds the burst (Twisted's default, 50, resets the rest at connect:
    # a property of the listening socket, before any of Pagoda's code runs).
    site.daphne = site.spawn("daphne", [
        sys.executable, "-m", "daphne", "-e", f"tcp:port={site.port}:interface=127.0.0.1:backlog={NUM_BURST}",
        "webapp.config.asgi:application"])
    site.redis = redis.Redis.from_url(db)
    try:
        site.wait_until(lambda: site.metric("pagoda:num_requests_running", model_name=MODEL) is not None,
                        "the worker announcing itself over Redis")
        site.wait_until(lambda: site.metric("pagoda:api_requests_capacity") == NUM_SEQS,
                        "the gate reading the worker's capacity")
        yield site
    finally:
        site.stop()


def yardstick_p99(site) -> float:
    """The refusals' p99 of a burst against Daphne alone (an application that refuses at once)."""
    bare = Site(site.root, {**site.env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                       site.env["PYTHONPATH"]])})
    bare.spawn("daphne-yardstick", [sys.executable, "-m", "daphne", "-e",
                                    f"tcp:port={bare.port}:interface=127.0.0.1:backlog={NUM_BURST}",
                                    "refusing_asgi:application"])
    try:
        bare.wait_until(lambda: httpx.get(f"{bare.url}/", timeout=5).status_code == 503, "the yardstick listening")
        answers = burst(bare.url, "k", model=MODEL, streams=NUM_BURST, max_tokens=1, timeout_s=BURST_BUDGET_S)
    finally:
        bare.stop()
    assert all(a.status == 503 for a in answers)
    return figures(answers)["refusal_p99"]


def streams(site, n: int) -> list:
    # A stream's place at the gate is given back once Daphne has its last message, a moment after
    # the client read it: a batch sent right behind the last one could find the gate still full.
    site.wait_until(lambda: site.metric("pagoda:api_requests_in_flight") == 0, "the gate empty", timeout=30)
    return burst(site.url, site.key, model=MODEL, streams=n, max_tokens=MAX_TOKENS, timeout_s=BURST_BUDGET_S)


def test_a_burst_of_1000_streams_sheds_the_excess_at_once_and_serves_the_rest_in_their_tokens_time(site):
    floor_p99 = yardstick_p99(site)
    refusal_bound_s = max(REFUSAL_P99_S, FLOOR_SLACK * floor_p99)
    streams(site, NUM_SEQS)  # warm-up: the tokenizer export, the worker's first batch
    full = streams(site, NUM_SEQS)
    assert all(a.completed for a in full), [(a.status, a.body[-300:]) for a in full if not a.completed]
    full_batch_s = max(a.done_s for a in full)
    admitted_bound_s = full_batch_s * ADMITTED_SLACK + refusal_bound_s
    shed_before = site.metric("pagoda:api_requests_shed_total", endpoint="completions") or 0
    pid = site.daphne.pid
    rss_before = rss_mib(pid)

    started, client_cpu, daphne_cpu = time.monotonic(), time.process_time(), cpu_s(pid)
    answers = streams(site, NUM_BURST)
    took, client_cpu = time.monotonic() - started, time.process_time() - client_cpu
    daphne_cpu = cpu_s(pid) - daphne_cpu
    rss_after = rss_mib(pid)
    f = figures(answers)
    print(f"\n{NUM_BURST} streams of {MAX_TOKENS} tokens in {took:.1f} s (CPU: client {client_cpu:.2f} s, Daphne {daphne_cpu:.2f} s); Daphne RSS {rss_before:.0f} -> "
          f"{rss_after:.0f} MiB; load average {os.getloadavg()[0]:.2f}; {NUM_SEQS} streams alone: "
          f"{full_batch_s:.2f} s (admitted bound {admitted_bound_s:.2f} s); Daphne alone refuses the burst with p99 "
          f"{floor_p99:.2f} s (refusal bound {refusal_bound_s:.2f} s)\n{table(f)}")

    assert f["other"] == 0, sorted({str(a.status) for a in answers if not a.completed})
    assert f["completed"] >= NUM_SEQS and f["shed"] >= NUM_BURST // 2
    for a in answers:
        if a.completed:
            assert '"finish_reason": "length"' in a.body
        else:  # every refusal: the OpenAI error object, Retry-After, a request id
            error = json.loads(a.body)["error"]
            assert (a.status, error["type"], error["code"]) == (503, "server_error", "server_overloaded"), error
            assert int(a.headers["retry-after"]) >= 1 and a.headers["x-request-id"].startswith("cmpl-")
    at_gate = sum(1 for a in answers if not a.completed and "requests in progress" in a.body)
    assert at_gate >= NUM_BURST // 2  # refused before Django, not by the queue behind it
    assert site.metric("pagoda:api_requests_shed_total", endpoint="completions") - shed_before == at_gate
    assert f["refusal_p99"] < refusal_bound_s, (f, floor_p99)
    assert f["admitted_p99"] < admitted_bound_s, (f, full_batch_s)
    assert rss_after - rss_before < 1024  # what 1,000 open requests hold, not an unbounded queue
    assert site.redis.xlen(f"pagoda:requests:{MODEL}") == 0  # nothing left queued behind
    assert site.metric("pagoda:api_requests_in_flight") == 0


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
