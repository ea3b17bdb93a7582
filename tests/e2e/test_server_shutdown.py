"""SIGTERM to Daphne in embedded mode (`make run`): the process exits promptly, and every request
it had accepted ends with an answer and a usage record, never a hang or a missing record.

Each test starts its own Daphne (and kills it) on one database with the tiny model "tiny", given an
8k context so that its 8,000-token stream runs for seconds even on a fast machine:
- a drain timeout longer than the generation (1,000 tokens of it: all 8,000 took over the 120 s
  timeout with both cores busy elsewhere): the running stream finishes normally, a request sent
  during the drain gets 503 server_shutting_down, then the process exits 0;
- a drain timeout far shorter than the generation: the embedded worker gives up on its running
  requests, whose clients get worker_lost at once and whose usage records say error.
"""

from __future__ import annotations

import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.conftest import LONG_CONTEXT
from tests.e2e.sites import make_site, readyz_ok

pytestmark = pytest.mark.e2e

LONG = dict(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=LONG_CONTEXT - 192,
            extra_body={"ignore_eos": True})
# Room in the KV pool for the two long requests the drain tests run at once (16-token blocks).
SETTINGS = {"num_kv_blocks": 2 * LONG_CONTEXT // 16 + 16, "max_model_len": LONG_CONTEXT, "max_num_seqs": 8}
EXIT_GRACE_S = 15.0  # beyond the drain timeout: reactor shutdown, worker threads joining


@pytest.fixture(scope="module")
def site(tmp_path_factory, long_llama_dir):
    site = make_site(tmp_path_factory.mktemp("shutdown_site"))
    site.manage("register_model", "tiny", str(long_llama_dir), "--engine-settings", json.dumps(SETTINGS))
    site.key = site.create_key("shutdown test")
    yield site
    site.stop()


def start_server(site, drain_timeout: float):
    daphne = site.start_daphne({"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_DRAIN_TIMEOUT": str(drain_timeout)})
    site.wait_until(lambda: readyz_ok(site), "the embedded worker for tiny coming up")
    return daphne, openai.OpenAI(base_url=f"{site.url}/v1", api_key=site.key, max_retries=0, timeout=60)


def sigterm(site, daphne) -> float:
    site.procs.remove(daphne)  # its exit is expected now
    daphne.send_signal(signal.SIGTERM)
    return time.monotonic()


def first_text_chunk(chunks):
    chunk = next(chunks)
    while not (chunk.choices and chunk.choices[0].text):
        chunk = next(chunks)
    return chunk


def test_sigterm_lets_the_running_stream_finish_refuses_new_requests_and_exits_0(site):
    drain_timeout = 120.0  # far more than the stream needs, even on a busy machine
    daphne, client = start_server(site, drain_timeout)
    body = {**LONG, "max_tokens": 1000}  # seconds of tokens, well under the timeout on a busy machine
    chunks = iter(client.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    first = first_text_chunk(chunks)

    sent_at = sigterm(site, daphne)
    time.sleep(0.2)  # the reactor runs its shutdown triggers at once; the stream still has most tokens to go
    refused = httpx.post(f"{site.url}/v1/completions", json={**LONG, "max_tokens": 4},
                         headers={"Authorization": f"Bearer {site.key}"}, timeout=30)
    rest = list(chunks)
    code = daphne.wait(timeout=drain_timeout + EXIT_GRACE_S)
    exited_after = time.monotonic() - sent_at
    print(f"Daphne exited {exited_after:.1f} s after SIGTERM with code {code}")

    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "server_shutting_down")
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
    assert rest[-1].usage.completion_tokens == body["max_tokens"]
    assert code == 0 and exited_after < drain_timeout  # it left once the stream was done, not at the timeout
    record = site.usage(first.id)
    assert (record["status"], record["completion_tokens"]) == ("ok", body["max_tokens"])
    assert site.usage(refused.headers["X-Request-Id"])["error_code"] == "server_shutting_down"
    assert re.search(r"worker \S+ stopped", site.log("daphne"))  # the embedded worker drained, then stopped


def test_a_drain_timeout_shorter_than_the_generation_ends_streamed_and_whole_requests_with_records(
        site, tiny_tokenizer):
    drain_timeout = 0.05  # far shorter than the long stream, even on an idle machine
    daphne, client = start_server(site, drain_timeout)
    outcome = {}

    def whole():
        try:
            outcome["response"] = client.completions.create(**LONG)
        except openai.APIError as exc:
            outcome["error"] = exc

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(whole)
        # running before the SIGTERM: sent too late, it found Daphne no longer listening (a
        # connection error, seen in a CI run) instead of a 503 with a record
        site.wait_until(lambda: (site.metric("pagoda:num_requests_running", model_name="tiny") or 0) >= 1
                        or pending.done(), "the whole request running", timeout=60)
        chunks = iter(client.completions.create(**LONG, stream=True))
        first = first_text_chunk(chunks)
        sent_at = sigterm(site, daphne)
        with pytest.raises(openai.APIError) as caught:
            list(chunks)  # the worker gives up after the drain timeout: an error event, not a hang
        told_after = time.monotonic() - sent_at
        pending.result(timeout=30)
    code = daphne.wait(timeout=drain_timeout + EXIT_GRACE_S)
    exited_after = time.monotonic() - sent_at
    print(f"stream: {caught.value.code} {told_after:.2f} s after SIGTERM; Daphne exited {exited_after:.1f} s "
          f"after it with code {code}")

    assert caught.value.code == "worker_lost" and told_after < drain_timeout + 5
    assert code == 0
    record = site.usage(first.id)
    assert (record["status"], record["error_code"]) == ("error", "worker_lost")
    assert 0 < record["completion_tokens"] < LONG["max_tokens"]
    assert record["prompt_tokens"] == len(tiny_tokenizer.encode(LONG["prompt"]))
    # The whole request was sent first, but whether the worker took it before it began to drain
    # (worker_lost) or not (no_worker: it was never started) is up to the two clients' race.
    error = outcome.get("error")
    assert isinstance(error, openai.InternalServerError), outcome
    assert error.status_code == 503 and error.code in ("worker_lost", "no_worker")
    record = site.usage(error.response.headers["X-Request-Id"])
    assert (record["status"], record["error_code"]) == ("error", error.code)
