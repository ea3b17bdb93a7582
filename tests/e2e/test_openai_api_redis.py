"""Distributed mode: Daphne and a `manage.py run_engine_worker` process meet through a real Redis."""

import time

import httpx
import openai
import pytest

from engine.sampling_params import SamplingParams
from tests.e2e.sites import READYZ_TOKEN

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 1.5  # a worker heartbeat (with its stats) is at most this old
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def client(redis_site):
    return openai.OpenAI(base_url=f"{redis_site.url}/v1", api_key=redis_site.keys["all"], max_retries=0,
                         timeout=120)


def test_greedy_chat_over_redis_equals_the_engines_and_is_accounted(client, redis_site, tiny_llm):
    reference = tiny_llm.chat(STORY, SamplingParams(temperature=0, max_tokens=12))[0]

    response = client.chat.completions.create(model="tiny", messages=STORY, temperature=0, max_tokens=12)

    assert response.choices[0].message.content == reference.text
    record = redis_site.usage(response.id)
    assert (record["status"], record["prompt_tokens"], record["completion_tokens"]) == \
        ("ok", len(reference.prompt_token_ids), len(reference.token_ids))


def test_streamed_completion_over_redis_ends_with_the_usage_chunk(client):
    whole = client.completions.create(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=20)
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", temperature=0,
                                            max_tokens=20, stream=True, stream_options={"include_usage": True}))

    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_an_active_model_without_a_worker_is_503_no_worker(client, redis_site):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="idle", messages=STORY)

    assert caught.value.status_code == 503 and caught.value.code == "no_worker"
    assert redis_site.last_usage()["error_code"] == "no_worker"


def test_readyz_names_the_model_no_worker_serves(redis_site):
    response = httpx.get(f"{redis_site.url}/readyz", headers={"X-Readyz-Token": READYZ_TOKEN})

    assert response.status_code == 503
    body = response.json()
    assert body["reasons"] == ["no live worker serves the model 'idle'"]
    assert body["checks"]["redis"] == "ok" and body["checks"]["database"] == "ok"


def test_closing_a_stream_aborts_the_request_in_the_worker_process(redis_site, disconnect_stream):
    # 16 choices of 480 tokens: about 10 s of the tiny model in its 64 KV blocks. One of 480 (CI,
    # quiet) and then 8 x 480 (CI, loaded: 4.5 s here) finished before the abort reached the worker,
    # and were recorded ok.
    n, max_tokens = 16, 480
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": max_tokens, "n": n, "ignore_eos": True}
    time.sleep(HEARTBEAT_S)  # the counter below then includes every earlier request

    def generated() -> float:
        return redis_site.metric("pagoda:generation_tokens_total", model_name="tiny") - generated_before

    generated_before = redis_site.metric("pagoda:generation_tokens_total", model_name="tiny")
    request_id = disconnect_stream(redis_site, redis_site.keys["all"], body, wait_running=False)
    hung_up = time.monotonic()
    record = redis_site.usage(request_id, timeout=60)
    assert record["status"] == "aborted", (f"recorded {record['status']} {time.monotonic() - hung_up:.1f} s "
                                           f"after the hang-up with {record['completion_tokens']} tokens")

    # The worker stopped: its count holds still across a heartbeat, short of what was asked for.
    # (Not num_requests_running == 0 alone: a heartbeat from before the request says so too.)
    counts, deadline = [generated()], time.monotonic() + 60
    while len(counts) < 2 or counts[-1] != counts[-2]:
        assert time.monotonic() < deadline, f"the worker kept generating: {counts}"
        time.sleep(HEARTBEAT_S)
        counts.append(generated())
    assert 0 < counts[-1] < n * max_tokens, counts
    assert redis_site.metric("pagoda:num_requests_running", model_name="tiny") == 0
