"""Activating another version while requests stream: none fails, new ones go to the new version.

Each mode gets a site of its own (its model "swap" changes version, which the shared sites must
not see): embedded (the worker runs inside Daphne; the console's activation swaps it) and Redis
(``run_engine_worker`` polls the registry and swaps engines in its process). Both versions are
the suite's tiny random Llama architecture (with 2048 positions, so that a request outlasts a
version switch) with different random weights, so the text itself tells which version produced
it: every answer is compared with the engine's own greedy output for that checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.e2e.sites import REPO_ROOT, TINY_SETTINGS, make_site

pytestmark = pytest.mark.e2e

MODEL = "swap"
USERNAME, PASSWORD = "switcher", "switch-versions-safely"
PROMPTS = ["Once upon a time", "The lighthouse keeper", "In a small village", "Rain fell on the"]
# Long enough that the first requests are still streaming on v1 while v2 loads and takes over
# (the suite's tiny Llama stops at 512 positions, which it runs through in about a second).
CONTEXT = 2048
LONG_TOKENS = 1500
SHORT_TOKENS = 24
SETTINGS = {**TINY_SETTINGS, "max_model_len": CONTEXT, "num_kv_blocks": 512}
SWITCH_TIMEOUT_S = 180
# The first requests' drain (pagoda.yaml's serving.drain_timeout_s, 30 s by default) must outlast
# them on a loaded CI machine: both modes take it from the deployment's settings.
DRAIN_TIMEOUT_S = "150"


def tiny_llama(directory, seed: int):
    """The suite's tiny Llama architecture with 2048 positions, random weights from ``seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.text.tokenizer import load_tokenizer
    from tests.conftest import TINY_LLAMA_SIZES

    torch.manual_seed(seed)
    sizes = {**TINY_LLAMA_SIZES, "max_position_embeddings": CONTEXT}
    LlamaForCausalLM(LlamaConfig(**sizes)).save_pretrained(directory)
    load_tokenizer("smollm2").save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Version 1 and version 2: the same architecture, other weights (so other text)."""
    return {"1": tiny_llama(tmp_path_factory.mktemp("swap_v1"), 0),
            "2": tiny_llama(tmp_path_factory.mktemp("swap_v2"), 1)}


@pytest.fixture(scope="module")
def references(checkpoints):
    """Greedy completions of each version, computed by the engine in this process."""
    from engine import LLM
    from engine.sampling_params import SamplingParams

    texts = {}
    for label, path in checkpoints.items():
        llm = LLM(str(path), **SETTINGS)
        for max_tokens in (LONG_TOKENS, SHORT_TOKENS):
            outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            texts[label, max_tokens] = [o.text for o in outs]
        del llm
    assert texts["1", SHORT_TOKENS] != texts["2", SHORT_TOKENS]  # the text tells the versions apart
    return texts


@pytest.fixture(scope="module", params=["embedded", "redis"])
def site(request, tmp_path_factory, checkpoints):
    mode = request.param
    extra = {"REDIS_URL": request.getfixturevalue("redis_server")} if mode == "redis" else {}
    extra["PAGODA_DRAIN_TIMEOUT"] = DRAIN_TIMEOUT_S
    site = make_site(tmp_path_factory.mktemp(f"switch_{mode}"), extra)
    site.mode = mode
    site.manage("register_model", MODEL, str(checkpoints["1"]), "--engine-settings", json.dumps(SETTINGS))
    site.manage("register_model", MODEL, str(checkpoints["2"]), "--engine-settings", json.dumps(SETTINGS),
                "--no-activate")
    result = subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", USERNAME,
                             "--email", "s@example.com"], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**site.env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD}, timeout=120)
    assert result.returncode == 0, result.stderr
    site.key = site.create_key("switch")
    if mode == "redis":
        site.worker = site.spawn("worker", [sys.executable, "manage.py", "run_engine_worker", "--model", MODEL,
                                            "--poll-interval", "0.5"])
        site.start_daphne()
    else:
        site.start_daphne({"PAGODA_EMBEDDED_WORKERS": "1"})
    try:
        site.wait_until(lambda: served_versions(site) == ["1"], f"{mode}: a worker serving {MODEL} v1")
        yield site
    finally:
        site.stop()


# ------------------------------------------------------------------ reading and driving the site
def live_workers(site) -> list[dict]:
    """The workers of MODEL as the metrics endpoint lists them (draining ones included)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{site.url}/metrics", timeout=10).text
    workers = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "pagoda:num_requests_running" and sample.labels.get("model_name") == MODEL:
                workers[sample.labels["worker"]] = {"version": sample.labels["version"],
                                                    "running": sample.value}
    return list(workers.values())


def served_versions(site) -> list[str]:
    return sorted(w["version"] for w in live_workers(site))


def version_ids(site) -> dict[int, int]:
    with sqlite3.connect(site.db_path) as db:
        rows = db.execute("SELECT v.number, v.id FROM registry_modelversion v JOIN registry_model m "
                          "ON m.id = v.model_id WHERE m.slug = ?", (MODEL,)).fetchall()
    return dict(rows)


def console(site) -> httpx.Client:
    """An httpx client logged in as staff, sending the CSRF token with every POST."""
    http = httpx.Client(base_url=site.url, timeout=60)
    http.get("/accounts/login/")
    response = http.post("/accounts/login/", data={"username": USERNAME, "password": PASSWORD,
                                                   "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert response.status_code == 302, response.text[-2000:]
    http.headers["X-CSRFToken"] = http.cookies["csrftoken"]
    return http


def version_action(http: httpx.Client, version_id: int, action: str) -> str:
    response = http.post(f"/console/models/versions/{version_id}/{action}/", follow_redirects=True)
    assert response.status_code == 200
    assert "Cannot" not in response.text, response.text[-3000:]
    return response.text


def complete(client: openai.OpenAI, prompt: str, max_tokens: int, started=None) -> dict:
    """A streamed greedy completion; what came back and when it ended. ``started`` is set at the first chunk."""
    chunks = []
    for chunk in client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=max_tokens,
                                           stream=True, extra_body={"ignore_eos": True}):
        chunks.append(chunk)
        if started is not None:
            started.release()
            started = None
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return {"id": chunks[0].id, "text": "".join(c.choices[0].text for c in chunks if c.choices),
            "finish_reason": finish[-1] if finish else None, "ended": time.monotonic()}


def test_activation_switches_versions_while_requests_stream_and_none_fails(site, references):
    client = openai.OpenAI(base_url=f"{site.url}/v1", api_key=site.key, max_retries=0, timeout=180)
    ids = version_ids(site)
    http = console(site)
    streaming = threading.Semaphore(0)
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        first = [pool.submit(complete, client, prompt, LONG_TOKENS, streaming) for prompt in PROMPTS]
        for _ in PROMPTS:
            assert streaming.acquire(timeout=60), "the first requests did not start streaming"

        version_action(http, ids[2], "activate")
        activated = time.monotonic()
        # Sent while v2 loads (and v1 still serves): these must not fail either.
        during = [pool.submit(complete, client, prompt, SHORT_TOKENS) for prompt in PROMPTS]
        site.wait_until(lambda: "2" in served_versions(site), "v2's worker announcing itself",
                        timeout=SWITCH_TIMEOUT_S)
        v2_ready = time.monotonic()
        first = [f.result(timeout=SWITCH_TIMEOUT_S) for f in first]
        during = [f.result(timeout=SWITCH_TIMEOUT_S) for f in during]

    # Every first request ran to its end on v1: full length, v1's exact text, an ok usage record.
    assert [r["finish_reason"] for r in first] == ["length"] * len(PROMPTS)
    assert [r["text"] for r in first] == references["1", LONG_TOKENS]
    for r in first:
        record = site.usage(r["id"], timeout=30)
        assert (record["status"], record["completion_tokens"], record["version_id"]) == ("ok", LONG_TOKENS, ids[1])
    # They were streaming when the activation committed, and v1 still ran them when v2 took over:
    # it drained them, it did not cut them short.
    assert all(r["ended"] > activated for r in first)
    assert any(r["ended"] > v2_ready for r in first), "the first requests ended before v2 was ready"
    # Requests sent mid-switch were answered whole by one version or the other, and their usage
    # names the version that answered (the worker stamps it), not the one active at admission.
    for r, prompt_index in zip(during, range(len(PROMPTS))):
        assert r["finish_reason"] == "length"
        by_version = {v: references[v, SHORT_TOKENS][prompt_index] for v in ("1", "2")}
        assert r["text"] in by_version.values()
        answered_by = next(v for v, text in by_version.items() if text == r["text"])
        assert site.usage(r["id"], timeout=30)["version_id"] == ids[int(answered_by)]

    # v1's worker leaves once its requests are done; v2 alone serves, and new requests get v2's text.
    site.wait_until(lambda: served_versions(site) == ["2"], "v1's worker stopping", timeout=30)
    after = [complete(client, prompt, SHORT_TOKENS) for prompt in PROMPTS]
    assert [r["text"] for r in after] == references["2", SHORT_TOKENS]
    assert {site.usage(r["id"], timeout=30)["version_id"] for r in after} == {ids[2]}
    workers = http.get("/console/workers.json").json()
    assert [(w["model"], w["version"]) for w in workers["workers"] if w["model"] == MODEL
            and w["state"] != "lost"] == [(MODEL, "2")]

    # Deactivating the active version drains the model's worker; activating v1 brings one back.
    version_action(http, ids[2], "deactivate")
    site.wait_until(lambda: served_versions(site) == [], "the worker leaving after deactivation", timeout=30)
    if site.mode == "redis":
        assert site.worker.poll() is None  # it waits for the next activation instead of exiting
    version_action(http, ids[1], "activate")
    site.wait_until(lambda: served_versions(site) == ["1"], "v1 served again", timeout=SWITCH_TIMEOUT_S)
    again = complete(client, PROMPTS[0], SHORT_TOKENS)
    assert again["text"] == references["1", SHORT_TOKENS][0]
