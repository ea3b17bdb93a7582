"""A worker SIGKILLed mid-request: the client gets an error within seconds and the usage says so.

The site here is its own (Daphne, database, worker) so that killing its worker leaves the shared
``redis_site`` serving. It shares the session's redis-server, under its own model slug "doomed":
request streams, heartbeats and aborts are all keyed by slug, so the two sites never meet.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import openai
import pytest
import redis

from tests.e2e.sites import TINY_SETTINGS, make_site
from workers.redis_transport import reply_stream

pytestmark = pytest.mark.e2e

MODEL = "doomed"
PROMPT = "Once upon a time"
# Long enough that the tiny model is still generating when the kill lands a few tokens in.
BODY = dict(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=400, extra_body={"ignore_eos": True})
MAX_NOTICE_S = 10.0  # heartbeat TTL (5 s) + one silent watch interval (1 s), with room to spare


@pytest.fixture(scope="module")
def mortal_site(tmp_path_factory, tiny_llama_dir, redis_server):
    site = make_site(tmp_path_factory.mktemp("mortal_site"), {"REDIS_URL": redis_server})
    site.manage("register_model", MODEL, str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.key = site.create_key("doomed model")
    site.redis = redis.Redis.from_url(redis_server, decode_responses=True)
    site.num_workers = 0
    site.start_daphne()
    try:
        yield site
    finally:
        site.stop()


@pytest.fixture
def worker(mortal_site):
    """A fresh worker process for each test (each test kills it); it is announced when returned."""
    site = mortal_site
    site.num_workers += 1
    proc = site.spawn(f"worker{site.num_workers}", [sys.executable, "manage.py", "run_engine_worker",
                                                    "--model", MODEL, "--drain-timeout", "5"])
    try:
        site.wait_until(lambda: site.metric("pagoda:num_requests_running", model_name=MODEL) is not None,
                        "the doomed worker announcing itself over Redis")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc in site.procs:
            site.procs.remove(proc)


def sigkill(site, proc) -> float:
    """SIGKILL the worker (no drain, no goodbye); returns when it was sent."""
    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait(timeout=10)
    site.procs.remove(proc)  # a dead process is expected now: wait_until must not fail on it
    return killed_at


@pytest.fixture
def client(mortal_site):
    # A timeout well past MAX_NOTICE_S: a hang fails the test instead of stalling the suite.
    return openai.OpenAI(base_url=f"{mortal_site.url}/v1", api_key=mortal_site.key, max_retries=0, timeout=60)


def test_stream_whose_worker_is_killed_ends_with_worker_lost_and_error_usage(mortal_site, worker, client,
                                                                          tiny_tokenizer):
    stream = client.completions.create(**BODY, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    while not (first.choices and first.choices[0].text):
        first = next(chunks)
    killed_at = sigkill(mortal_site, worker)

    num_text_chunks = 1
    with pytest.raises(openai.APIError) as caught:
        for chunk in chunks:
            num_text_chunks += bool(chunk.choices and chunk.choices[0].text)
    noticed_after = time.monotonic() - killed_at
    print(f"stream: worker_lost {noticed_after:.2f} s after SIGKILL, {num_text_chunks} text chunks received")

    assert caught.value.code == "worker_lost"
    assert noticed_after < MAX_NOTICE_S
    assert num_text_chunks < BODY["max_tokens"]  # the kill landed mid-generation
    record = mortal_site.usage(first.id)
    assert (record["status"], record["error_code"]) == ("error", "worker_lost")
    assert record["prompt_tokens"] == len(tiny_tokenizer.encode(PROMPT))
    assert 0 < record["completion_tokens"] < BODY["max_tokens"]


def _wait_for_a_generated_token(site, earlier: set[str]) -> None:
    """Until a new request's reply stream holds the worker's claim and at least one chunk.

    ``earlier``: reply streams that existed before (an aborted request's last chunk lingers).
    """
    def generating() -> bool:
        return any(site.redis.xlen(key) >= 2 for key in site.redis.scan_iter(match=reply_stream("*"))
                   if key not in earlier)
    site.wait_until(generating, "the worker streaming the first tokens of the request", timeout=30)


def test_non_streamed_request_whose_worker_is_killed_gets_503_worker_lost(mortal_site, worker, client,
                                                                         tiny_tokenizer):
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["response"] = client.completions.create(**BODY)
        except openai.APIError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    earlier = set(mortal_site.redis.scan_iter(match=reply_stream("*")))
    caller = threading.Thread(target=call)
    caller.start()
    _wait_for_a_generated_token(mortal_site, earlier)
    killed_at = sigkill(mortal_site, worker)
    caller.join(timeout=60)
    assert not caller.is_alive(), "the non-streamed request hung after its worker died"
    noticed_after = outcome["at"] - killed_at
    print(f"non-streamed: HTTP error {noticed_after:.2f} s after SIGKILL")

    error = outcome.get("error")
    assert isinstance(error, openai.InternalServerError), outcome
    assert (error.status_code, error.code) == (503, "worker_lost")
    assert noticed_after < MAX_NOTICE_S
    record = mortal_site.usage(error.response.headers["X-Request-Id"])
    assert (record["status"], record["error_code"]) == ("error", "worker_lost")
    assert record["prompt_tokens"] == len(tiny_tokenizer.encode(PROMPT))
