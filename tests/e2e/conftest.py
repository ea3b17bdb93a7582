"""Fixtures of the end-to-end tests: real Daphne sites driven with the official openai client.

The machinery (Site, make_site, TINY_SETTINGS, free_port...) lives in tests/e2e/sites.py, a plain
module that test modules building sites of their own import from.

- ``embedded_site``: Daphne with PAGODA_EMBEDDED_WORKERS=1 and no REDIS_URL; serves a tiny random
  Llama as "tiny" and the bundled SmolLM2 as "smollm2" from workers inside the web process.
- ``redis_site``: Daphne with REDIS_URL set to a private redis-server, plus one
  ``manage.py run_engine_worker --model tiny`` process; the active model "idle" has no worker.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.e2e.sites import (REPO_ROOT, START_TIMEOUT_S, TINY_SETTINGS, Site, free_port,  # noqa: F401
                             make_site, open_stream_then_disconnect, post_then_hang_up, readyz_ok)


@pytest.fixture(scope="session")
def embedded_site(tmp_path_factory, tiny_llama_dir):
    site = make_site(tmp_path_factory.mktemp("embedded_site"))
    site.manage("register_model", "tiny", str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.manage("ensure_bundled_model")
    site.keys = {"all": site.create_key("all models"), "tiny": site.create_key("tiny only", "tiny")}
    try:
        site.start_embedded("embedded workers for tiny and smollm2 coming up")
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="session")
def redis_site(tmp_path_factory, tiny_llama_dir, redis_server):
    site = make_site(tmp_path_factory.mktemp("redis_site"), {"REDIS_URL": redis_server})
    site.manage("register_model", "tiny", str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.manage("register_model", "idle", str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.keys = {"all": site.create_key("all models")}
    site.worker = site.spawn("worker", [sys.executable, "manage.py", "run_engine_worker", "--model", "tiny",
                                        "--drain-timeout", "5"])
    site.start_daphne()
    try:
        site.wait_until(lambda: site.metric("pagoda:num_requests_running", model_name="tiny") is not None,
                        "the tiny worker announcing itself over Redis")
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's, driven by Playwright; never `playwright install`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_dir):
    """The engine's tokenizer of the tiny model: the reference for prompt token counts."""
    from engine.text.tokenizer import load_tokenizer

    return load_tokenizer(str(tiny_llama_dir))


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama_dir):
    """The engine in this process with the served settings: the reference for generated text."""
    from engine import LLM

    return LLM(str(tiny_llama_dir), **TINY_SETTINGS)


@pytest.fixture
def disconnect_stream():
    return open_stream_then_disconnect


@pytest.fixture
def hang_up():
    return post_then_hang_up
